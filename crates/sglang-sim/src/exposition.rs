//! Prometheus text as `prometheus_client` (SGLang's exporter, multiprocess mode) writes it: one
//! family's HELP, TYPE and samples, label and help escaping, and floats printed as Python does.

use std::fmt::Write as _;

use crate::service::Series;

/// One sample: its suffix, labels and value.
pub(crate) type Line = (&'static str, Vec<(String, String)>, f64);

pub(crate) struct Family {
    name: String,
    help: String,
    kind: &'static str,
    /// `(sample suffix, labels, value)`: the suffix is `_bucket`, `_count` or `_sum` for a
    /// histogram, empty otherwise (a counter's `_total` is added when written).
    pub(crate) samples: Vec<Line>,
}

impl Family {
    /// Add a gauge sample to the family `name` in `fams`, or a new family (one family per name
    /// however many ranks write it, as the exposition format requires).
    pub(crate) fn add_gauge(fams: &mut Vec<Family>, name: &str, help: &str, labels: Vec<(String, String)>, value: f64) {
        match fams.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push(("", labels, value)),
            None => fams.push(Family::gauge(name, help, vec![(labels, value)])),
        }
    }

    pub(crate) fn gauge(name: &str, help: &str, samples: Vec<(Vec<(String, String)>, f64)>) -> Family {
        Family { name: name.to_string(), help: help.to_string(), kind: "gauge", samples: samples.into_iter().map(|(l, v)| ("", l, v)).collect() }
    }

    pub(crate) fn counter(name: &str, help: &str, samples: Vec<(Vec<(String, String)>, f64)>) -> Family {
        Family { name: name.to_string(), help: help.to_string(), kind: "counter", samples: samples.into_iter().map(|(l, v)| ("", l, v)).collect() }
    }

    /// A histogram's series: for each label set, its cumulative buckets (`le` last among the
    /// labels), `_count` and `_sum`.
    pub(crate) fn histogram(name: &str, help: &str, series: Vec<(Vec<(String, String)>, &Series)>) -> Family {
        let mut samples = Vec::new();
        for (labels, s) in series {
            let (buckets, count, sum) = s.cumulative();
            for (le, c) in buckets {
                let mut l = labels.clone();
                l.push(("le".to_string(), py_float(le)));
                samples.push(("_bucket", l, c as f64));
            }
            samples.push(("_count", labels.clone(), count as f64));
            samples.push(("_sum", labels, sum));
        }
        Family { name: name.to_string(), help: help.to_string(), kind: "histogram", samples }
    }

    pub(crate) fn write(&self, out: &mut String, openmetrics: bool) {
        let is_counter = self.kind == "counter";
        let base = if openmetrics { self.name.replace(':', "_") } else { self.name.clone() };
        // prometheus_client's text format names a counter's family with its `_total`; OpenMetrics
        // names the family without it.
        let family = if is_counter && !openmetrics { format!("{base}_total") } else { base.clone() };
        let _ = writeln!(out, "# HELP {family} {}", escape_help(&self.help));
        let _ = writeln!(out, "# TYPE {family} {}", self.kind);
        for (suffix, labels, value) in &self.samples {
            out.push_str(&base);
            out.push_str(if is_counter { "_total" } else { suffix });
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {}", py_float(*value));
        }
    }
}

pub(crate) fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

pub(crate) fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"")
}

/// Format a value as Python's `prometheus_client` does (`repr(float)`, `+Inf`, `NaN`).
pub fn py_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        assert_eq!(py_float(1234.0), "1234.0");
        assert_eq!(py_float(0.25), "0.25");
        assert_eq!(py_float(f64::NAN), "NaN");
        assert_eq!(py_float(f64::NEG_INFINITY), "-Inf");
    }
}
