//! A strict parser of the Prometheus text exposition format (0.0.4) that also reads OpenMetrics
//! text. Metric names may contain `:` (SGLang's `sglang:token_usage`), label values may contain
//! `}` and the escapes `\\`, `\"`, `\n`, values may be `NaN`, `+Inf`, `-Inf` or exponents, and a
//! sample may carry a timestamp. Malformed lines are an error naming the line — never silently
//! dropped (the popular `prometheus-parse` crate, 0.2, drops every sample whose name has a `:`,
//! i.e. every `sglang:` sample — measured when the parser was chosen; docs/architecture.md).

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Sample name (e.g. `sglang:token_usage`, `x_total`, `h_bucket`).
    pub name: String,
    /// Labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// A label's value.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// Samples in order.
    pub samples: Vec<Sample>,
    /// `# TYPE` per family name.
    pub types: BTreeMap<String, String>,
}

/// A malformed line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub msg: String,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Parse a float as the exposition formats write them.
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok().filter(|_| !s.contains(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')),
    }
}

/// Parse the whole text.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    let mut out = Exposition::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r');
        let err = |msg: String| ParseError { line: i + 1, msg };
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut parts = rest.trim_start().splitn(3, ' ');
            if parts.next() == Some("TYPE") {
                if let (Some(name), Some(ty)) = (parts.next(), parts.next()) {
                    out.types.insert(name.to_string(), ty.trim().to_string());
                }
            }
            continue;
        }
        let s = parse_sample(line).map_err(err)?;
        out.samples.push(s);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    let take_name = |i: &mut usize| -> Result<String, String> {
        let start = *i;
        if !chars.get(*i).copied().is_some_and(is_name_start) {
            return Err(format!("expected a metric or label name at column {}", *i + 1));
        }
        while chars.get(*i).copied().is_some_and(is_name_char) {
            *i += 1;
        }
        Ok(chars[start..*i].iter().collect())
    };
    let name = take_name(&mut i)?;
    let mut labels = Vec::new();
    if chars.get(i) == Some(&'{') {
        i += 1;
        loop {
            while chars.get(i) == Some(&' ') {
                i += 1;
            }
            if chars.get(i) == Some(&'}') {
                i += 1;
                break;
            }
            let key = take_name(&mut i)?;
            if chars.get(i) != Some(&'=') || chars.get(i + 1) != Some(&'"') {
                return Err(format!("label {key} of {name}: expected =\""));
            }
            i += 2;
            let val = label_value(&chars, &mut i).map_err(|why| format!("label {key} of {name}: {why}"))?;
            labels.push((key, val));
            match chars.get(i) {
                Some(',') => i += 1,
                Some('}') => {
                    i += 1;
                    break;
                }
                _ => return Err(format!("labels of {name}: expected , or }}")),
            }
        }
    }
    let rest: String = chars[i..].iter().collect();
    if !rest.starts_with([' ', '\t']) {
        return Err(format!("{name}: expected a space before the value"));
    }
    let mut fields = rest.split_whitespace();
    let v = fields.next().ok_or_else(|| format!("{name}: missing value"))?;
    let value = parse_value(v).ok_or_else(|| format!("{name}: bad value {v:?}"))?;
    if let Some(ts) = fields.next() {
        if ts.parse::<f64>().is_err() {
            return Err(format!("{name}: bad timestamp {ts:?}"));
        }
    }
    if fields.next().is_some() {
        return Err(format!("{name}: trailing text after the value"));
    }
    Ok(Sample { name, labels, value })
}

/// A label's quoted value from `chars[*i..]` (after its opening quote) up to its closing quote,
/// unescaped; `*i` ends after the closing quote.
fn label_value(chars: &[char], i: &mut usize) -> Result<String, String> {
    let mut val = String::new();
    loop {
        match chars.get(*i) {
            None => return Err("unterminated value".into()),
            Some('"') => {
                *i += 1;
                return Ok(val);
            }
            Some('\\') => {
                match chars.get(*i + 1) {
                    Some('\\') => val.push('\\'),
                    Some('"') => val.push('"'),
                    Some('n') => val.push('\n'),
                    other => return Err(format!("bad escape \\{}", other.map(|c| c.to_string()).unwrap_or_default())),
                }
                *i += 2;
            }
            Some(c) => {
                val.push(*c);
                *i += 1;
            }
        }
    }
}

/// The sum of sample values, `0.0` when there are none. Rust's own `Sum` for `f64` starts from
/// `-0.0` (IEEE 754's additive identity), so an absent counter summed with it would print as
/// "-0.0 %" in a sentence; this one starts from `+0.0`.
pub fn total(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(0.0, |a, b| a + b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_total_of_nothing_is_a_positive_zero() {
        let t = total(std::iter::empty());
        assert!(t == 0.0 && t.is_sign_positive(), "{t}");
        assert_eq!(format!("{:.1}", total(std::iter::empty()) * 100.0), "0.0");
        assert_eq!(total([1.5, 2.0]), 3.5);
    }

    use super::*;

    #[test]
    fn sglang_names_labels_and_special_values() {
        let text = "# HELP sglang:token_usage The token usage.\n# TYPE sglang:token_usage gauge\n\
            sglang:token_usage{engine_type=\"decode\",model_name=\"a}b \\\"q\\\" \\\\ \\n\",tp_rank=\"0\"} 0.25\n\
            sglang:x{} NaN\nsglang_y +Inf\nz -Inf 1700000000000\nw{a=\"1\",} 2.58e+06\n# EOF\n";
        let e = parse(text).unwrap();
        assert_eq!(e.samples.len(), 5);
        assert_eq!(e.samples[0].name, "sglang:token_usage");
        assert_eq!(e.samples[0].label("model_name"), Some("a}b \"q\" \\ \n"));
        assert_eq!(e.samples[0].value, 0.25);
        assert!(e.samples[1].value.is_nan());
        assert_eq!(e.samples[2].value, f64::INFINITY);
        assert_eq!(e.samples[3].value, f64::NEG_INFINITY);
        assert_eq!(e.samples[4].value, 2_580_000.0);
        assert_eq!(e.types["sglang:token_usage"], "gauge");
    }

    #[test]
    fn malformed_lines_are_errors_with_line_numbers() {
        assert_eq!(parse("ok 1\nbad{x=\"1\" 2\n").unwrap_err().line, 2);
        assert!(parse("a 1 2 3\n").is_err());
        assert!(parse("a{b=\"\\x\"} 1\n").is_err());
        assert!(parse("a abc\n").is_err());
        assert!(parse("9a 1\n").is_err());
        assert!(parse("a{b=\"unterminated} 1\n").is_err());
    }

    #[test]
    fn never_panics_on_arbitrary_input() {
        // A cheap deterministic fuzz: every prefix and every byte-flip of a real exposition.
        let base = "sglang:kv_used_tokens{engine_type=\"decode\",model_name=\"m\"} 1234.0\n# TYPE a gauge\na 1\n";
        for n in 0..=base.len() {
            if base.is_char_boundary(n) {
                let _ = parse(&base[..n]);
            }
        }
        let bytes = base.as_bytes();
        for i in 0..bytes.len() {
            for b in [b'{', b'}', b'"', b'\\', b' ', b'\n', b'=', b',', 0xff] {
                let mut v = bytes.to_vec();
                v[i] = b;
                let _ = parse(&String::from_utf8_lossy(&v));
            }
        }
    }
}
