//! `process_cpu_seconds_total` to the hundredth of a second.
//!
//! metrics-process exports it as an integer counter (the `metrics` crate's counters are `u64`),
//! so `rate(process_cpu_seconds_total[1m])` of a replica using a third of a core moved in steps
//! of a whole second and read 0 or 1/60 core at random. Its float option turns the series into a
//! gauge named `_total`, which `promtool check metrics` refuses. The exposition format allows a
//! float counter: the rendered line is replaced by the kernel's figure (`utime + stime` of
//! `/proc/self/stat`, in clock ticks), read at the same moment.

/// Replaces the `process_cpu_seconds_total` sample of `text` with the precise value, when the
/// platform tells it (Linux); otherwise leaves `text` as it is.
pub(super) fn refine(text: &mut String) {
    let Some(seconds) = cpu_seconds() else {
        return;
    };
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if line.starts_with("process_cpu_seconds_total ") {
            out.push_str(&format!("process_cpu_seconds_total {seconds:.2}\n"));
        } else {
            out.push_str(line);
        }
    }
    *text = out;
}

/// User plus system CPU time of this process, in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&stat, ticks_per_second()?)
}

/// `/proc` counts CPU time in `USER_HZ` ticks, which the Linux ABI fixes at 100 a second on
/// every architecture (whatever the kernel's own `HZ`).
fn ticks_per_second() -> Option<f64> {
    Some(100.0)
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line, in seconds. The command name
/// (field 2) is in parentheses and may hold spaces: fields are counted after its closing one.
fn parse_stat(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state): utime is field 14, index 11 here.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (materializer run) S 1 4242 4242 0 -1 4194560 1234 0 0 0 157 43 0 0 20 0 9 0 100 1000 200 18446744073709551615";
        assert_eq!(parse_stat(stat, 100.0), Some(2.0));
    }

    #[test]
    fn the_rendered_sample_carries_hundredths() {
        let mut text =
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\nother 1\n"
                .to_owned();
        refine(&mut text);
        let line = text
            .lines()
            .find(|l| l.starts_with("process_cpu_seconds_total "))
            .expect("the sample");
        let value = line.rsplit(' ').next().expect("a value");
        assert!(value.contains('.'), "{line}");
        assert!(value.parse::<f64>().is_ok_and(|v| v >= 0.0), "{line}");
        assert!(text.ends_with("other 1\n"), "{text}");
    }
}
