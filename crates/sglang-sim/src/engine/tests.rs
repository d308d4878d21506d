//! The scheduler's accounting and what `/metrics` shows of it, when.

use super::*;
use crate::args::parse;

fn engine(flags: &str) -> Engine {
    let v: Vec<String> = flags.split_whitespace().map(String::from).collect();
    Engine::new(Arc::new(parse(&v, &|_| None).unwrap()))
}

#[test]
fn a_quantization_or_a_pinned_tokenizer_is_another_model_and_a_weight_update_keeps_them() {
    let plain = engine("--model-path m");
    let fp8 = engine("--model-path m --quantization fp8");
    let tok = engine("--model-path m --tokenizer-path t --mem-fraction-static 0.8");
    assert_ne!(plain.weights().identity(), fp8.weights().identity());
    assert_ne!(plain.weights().identity(), tok.weights().identity());
    assert_eq!(tok.weights().identity(), engine("--model-path m --tokenizer-path t").weights().identity(), "serving flags are not the model");
    // A decode of the fp8 build counts KV of the plain build as mixed.
    fp8.count_decoded(&plain.weights().identity());
    fp8.count_decoded(&fp8.weights().identity());
    let counts = {
        let st = fp8.lock();
        (st.pd_decoded, st.mixed_versions)
    };
    assert_eq!(counts, (2, 1));
    fp8.load_weights("m2", Some("v2"));
    assert!(fp8.weights().identity().ends_with(" --quantization=fp8"), "{}", fp8.weights().identity());
}

#[test]
fn a_load_keeps_the_tokenizer_and_the_same_tokenizer_files_under_another_path_are_the_same_model() {
    let root = std::env::temp_dir().join(format!("sim-tok-{}", std::process::id()));
    let dir = |name: &str, vocab: &str| {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("tokenizer.json"), vocab).unwrap();
        d.display().to_string()
    };
    let (a, b, c) = (dir("a", "v1"), dir("b", "v1"), dir("c", "v2"));
    // Started on a, loaded b in place: computes with b's weights and a's tokenizer.
    let loaded = engine(&format!("--model-path {a}"));
    loaded.load_weights(&b, None);
    let restarted = |flags: &str| engine(flags).weights().identity();
    assert_eq!(loaded.weights().identity(), restarted(&format!("--model-path {b}")), "b's tokenizer files are a's");
    assert_eq!(loaded.weights().identity(), restarted(&format!("--model-path {b} --tokenizer-path {a}")), "pinned to the one it runs");
    assert_ne!(loaded.weights().identity(), restarted(&format!("--model-path {b} --tokenizer-path {c}")), "another vocabulary");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn usage_gauges_appear_only_after_first_batch() {
    let e = engine("--model-path m --enable-metrics");
    let before = e.render_metrics(false);
    assert!(before.contains("sglang:max_total_num_tokens{"), "{before}");
    assert!(!before.contains("sglang:kv_used_tokens"), "{before}");
    let t = e.admit(7);
    let after = e.render_metrics(false);
    assert!(after.contains("sglang:kv_used_tokens{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 7.0"), "{after}");
    e.finish(t);
}

#[test]
fn kv_accounting_adds_up() {
    let e = engine("--model-path m --sim-max-total-tokens 1000");
    let mut t = e.admit(100);
    for _ in 0..DECODE_LOG_INTERVAL {
        e.decode_step(&mut t);
    }
    let text = e.render_metrics(false);
    let get = |n: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(&format!("{n}{{"))).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (u, a, ev) = (get("sglang:kv_used_tokens"), get("sglang:kv_available_tokens"), get("sglang:kv_evictable_tokens"));
    assert_eq!(u, 140.0);
    assert_eq!(u + a + ev, 1000.0);
    e.finish(t);
    let mut t2 = e.admit(10);
    e.decode_step(&mut t2);
    let text = e.render_metrics(false);
    assert!(text.contains("sglang:kv_evictable_tokens{") && text.contains("} 140.0"), "{text}");
    e.finish(t2);
}

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(&format!("{name}{{")))?.rsplit(' ').next()?.parse().ok()
}

#[test]
fn pd_queue_gauges_move_only_at_a_batch_report_or_the_idle_publish() {
    const Q: &str = "sglang:num_prefill_bootstrap_queue_reqs";
    let e = engine("--model-path m --enable-metrics --disaggregation-mode prefill");
    let t = e.admit(10);
    assert_eq!(sample(&e.render_metrics(false), Q), Some(0.0), "the prefill batch report: nothing held yet");
    e.hold_room(&t);
    assert_eq!(e.load(), (0, 1, 10), "live: out of the running batch, waiting in the bootstrap queue");
    assert_eq!(sample(&e.render_metrics(false), Q), Some(0.0), "not published as the room moves");
    e.idle_tick();
    let text = e.render_metrics(false);
    assert_eq!((sample(&text, Q), sample(&text, "sglang:num_running_reqs")), (Some(1.0), Some(0.0)), "the stale running gauge publishes at once");
    e.release_room(t);
    assert_eq!(e.load(), (0, 0, 0));
    e.idle_tick();
    assert_eq!(sample(&e.render_metrics(false), Q), Some(1.0), "within the 30 s idle period the gauge keeps the last report");
    let later = engine("--model-path m --enable-metrics --disaggregation-mode prefill --sim-idle-publish-secs 0");
    let t = later.admit(10);
    later.hold_room(&t);
    later.idle_tick();
    later.release_room(t);
    later.idle_tick();
    assert_eq!(sample(&later.render_metrics(false), Q), Some(0.0), "the idle period passed: published");
    assert!(later.flush_cache());
}

#[test]
fn flush_cache_refuses_while_a_room_is_held() {
    let e = engine("--model-path m --disaggregation-mode prefill");
    let t = e.admit(5);
    e.hold_room(&t);
    assert!(!e.flush_cache(), "a held room is work in a PD queue");
    e.release_room(t);
    assert!(e.flush_cache());
}

#[test]
fn decode_role_does_not_publish_on_prefill() {
    let e = engine("--model-path m --disaggregation-mode decode");
    let t = e.admit(5);
    assert!(!e.render_metrics(false).contains("sglang:token_usage"));
    e.finish(t);
}

#[test]
fn old_versions_use_old_names_and_labels() {
    let e = engine("--model-path m --sim-version 0.4.6 --disaggregation-mode prefill");
    let t = e.admit(3);
    let text = e.render_metrics(false);
    assert!(text.contains("sglang:token_usage{engine_type=\"unified\",model_name=\"m\"} 0.0"), "{text}");
    assert!(text.contains("sglang:num_prefill_infight_queue_reqs{"));
    assert!(!text.contains("kv_used_tokens") && !text.contains("max_total_num_tokens"));
    e.finish(t);
    let e = engine("--model-path m --sim-version 0.5.10 --disaggregation-mode prefill");
    let t = e.admit(3);
    let text = e.render_metrics(false);
    assert!(text.contains("engine_type=\"prefill\""));
    assert!(text.contains("sglang:full_token_usage{") && !text.contains("kv_used_tokens"));
    assert!(text.contains("sglang:num_prefill_prealloc_queue_reqs{"));
    e.finish(t);
}

#[test]
fn openmetrics_uses_underscore_names_and_eof() {
    let e = engine("--model-path m");
    let t = e.admit(3);
    e.finish(t);
    assert!(!e.render_metrics(false).contains("sglang:num_requests_total"), "counted when a request finishes, not when admitted");
    e.observe_finished(false, 0.15, 7, 2);
    let text = e.render_metrics(true);
    assert!(text.contains("\nsglang_token_usage{"));
    assert!(!text.contains("sglang:"));
    assert!(text.contains("# TYPE sglang_num_requests counter\nsglang_num_requests_total{"));
    assert!(text.contains("# TYPE sglang_e2e_request_latency_seconds histogram\n"), "{text}");
    assert!(text.ends_with("# EOF\n"));
    let text = e.render_metrics(false);
    let labels = "engine_type=\"unified\",is_streaming=\"false\",model_name=\"m\"";
    for line in [
        format!("sglang:num_requests_total{{{labels}}} 1.0"),
        format!("sglang:e2e_request_latency_seconds_bucket{{{labels},le=\"0.1\"}} 0.0"),
        format!("sglang:e2e_request_latency_seconds_bucket{{{labels},le=\"0.2\"}} 1.0"),
        format!("sglang:e2e_request_latency_seconds_bucket{{{labels},le=\"+Inf\"}} 1.0"),
        format!("sglang:e2e_request_latency_seconds_count{{{labels}}} 1.0"),
        format!("sglang:e2e_request_latency_seconds_sum{{{labels}}} 0.15"),
    ] {
        assert!(text.contains(&line), "{line} in {text}");
    }
    assert!(!text.contains("time_to_first_token"), "nothing observed, no family");
}

#[test]
fn attention_dp_logs_one_series_per_group_each_with_its_own_pool() {
    // 0.5.23: every TP rank writes the constants with its dp_rank; each DP group's first rank
    // logs its own stats. Uneven load: the groups' gauges differ, each adds up on its own.
    let e = engine("--model-path m --tp-size 4 --attn-dp-size 2 --enable-metrics --disaggregation-mode decode --sim-max-total-tokens 1000");
    assert_eq!(e.config().dp_size, 1);
    let before = e.render_metrics(false);
    for (tp, dp) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        let want = format!(
            "sglang:max_total_num_tokens{{dp_rank=\"{dp}\",engine_type=\"decode\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"{tp}\"}} 1000.0"
        );
        assert!(before.contains(&want), "{want}\n{before}");
    }
    let mut a = e.admit(100); // rank 0
    let mut b = e.admit(300); // rank 1
    for _ in 0..DECODE_LOG_INTERVAL {
        e.decode_step(&mut a);
        e.decode_step(&mut b);
    }
    let text = e.render_metrics(false);
    let at = |name: &str, tp: u32, dp: u32| -> f64 {
        let prefix = format!("{name}{{dp_rank=\"{dp}\",engine_type=\"decode\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"{tp}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{prefix}\n{text}"))
    };
    assert_eq!((at("sglang:kv_used_tokens", 0, 0), at("sglang:kv_used_tokens", 2, 1)), (140.0, 340.0));
    for (tp, dp) in [(0, 0), (2, 1)] {
        let sum = at("sglang:kv_used_tokens", tp, dp) + at("sglang:kv_available_tokens", tp, dp) + at("sglang:kv_evictable_tokens", tp, dp);
        assert_eq!(sum, 1000.0, "rank {dp}");
    }
    assert!(!text.contains("tp_rank=\"1\"} 140") && text.matches("sglang:kv_used_tokens{").count() == 2, "{text}");
    e.finish(a);
    e.finish(b);
    // The deprecated spelling resolves the same way.
    let old = engine("--model-path m --tp-size 2 --dp-size 2 --enable-dp-attention");
    assert_eq!((old.config().attn_dp_size, old.config().dp_size), (2, 1));
}

#[test]
fn data_parallel_replicas_log_one_series_each_with_their_own_tp_rank_0() {
    // As the real 0.5.23 does with `--dp-size 2` on this CPU: every series tp_rank 0, dp_rank 0/1.
    let e = engine("--model-path m --dp-size 2 --enable-metrics --sim-max-total-tokens 1000");
    let a = e.admit(10);
    let b = e.admit(20);
    let text = e.render_metrics(false);
    for (dp, used) in [(0, 10), (1, 20)] {
        let l = format!("{{dp_rank=\"{dp}\",engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"}}");
        assert!(text.contains(&format!("sglang:max_total_num_tokens{l} 1000.0")), "{text}");
        assert!(text.contains(&format!("sglang:kv_used_tokens{l} {used}.0")), "{text}");
    }
    assert_eq!(text.matches("sglang:max_total_num_tokens{").count(), 2, "{text}");
    e.finish(a);
    e.finish(b);
}
