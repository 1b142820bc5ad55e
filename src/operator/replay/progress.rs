//! What a replay shows while it runs and how it reads `--from-time`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A redrawn bar (a terminal).
    Bar,
    /// A plain line every few seconds (a log file, a Kubernetes Job).
    Lines,
    Off,
}

impl ProgressMode {
    /// A bar on a terminal, lines otherwise.
    pub(crate) fn for_stderr() -> Self {
        if std::io::stderr().is_terminal() {
            Self::Bar
        } else {
            Self::Lines
        }
    }
}

/// Progress on stderr: a redrawn bar on a terminal, a plain line every five seconds otherwise.
/// Over a known total (a partition's range) it shows the share done; over an open-ended walk
/// (`patrol`'s mailboxes, `dlq redrive`'s letters) a count and its rate.
pub(crate) struct Progress {
    /// What reads: `replay`, `verify`, `patrol`, `dlq redrive`.
    verb: &'static str,
    mode: ProgressMode,
    /// The partition read, or none for a count.
    partition: Option<i32>,
    /// What is counted: `records`, `mailboxes`, `letters`.
    unit: &'static str,
    total: u64,
    done: u64,
    /// A detail the caller keeps current (`expired days 3, corrupt 0`).
    note: String,
    started: Instant,
    last: Instant,
}

impl Progress {
    pub(super) fn new(mode: ProgressMode, partition: i32, total: i64) -> Self {
        Self::named("replay", mode, partition, total)
    }

    /// Progress of `verb` (`verify`) over `total` records of `partition`.
    pub(crate) fn named(
        verb: &'static str,
        mode: ProgressMode,
        partition: i32,
        total: i64,
    ) -> Self {
        Self {
            verb,
            mode,
            partition: Some(partition),
            unit: "records",
            total: total.max(0) as u64,
            done: 0,
            note: String::new(),
            started: Instant::now(),
            last: Instant::now(),
        }
    }

    /// Progress of an open-ended count of `unit` (no total known).
    pub(crate) fn count(verb: &'static str, unit: &'static str, mode: ProgressMode) -> Self {
        Self {
            verb,
            mode,
            partition: None,
            unit,
            total: 0,
            done: 0,
            note: String::new(),
            started: Instant::now(),
            last: Instant::now(),
        }
    }

    /// Sets the detail shown after a count.
    pub(crate) fn note(&mut self, note: String) {
        self.note = note;
    }

    pub(crate) fn read(&mut self, n: u64) {
        self.done += n;
        let every = match self.mode {
            ProgressMode::Bar => Duration::from_millis(250),
            ProgressMode::Lines => Duration::from_secs(5),
            ProgressMode::Off => return,
        };
        if self.last.elapsed() >= every {
            self.draw();
            self.last = Instant::now();
        }
    }

    fn draw(&self) {
        let Some(partition) = self.partition else {
            let rate = self.done as f64 / self.started.elapsed().as_secs_f64().max(0.001);
            let note = if self.note.is_empty() {
                String::new()
            } else {
                format!("; {}", self.note)
            };
            let line = format!(
                "{}: {} {} ({rate:.0}/s){note}",
                self.verb, self.done, self.unit
            );
            let mut stderr = std::io::stderr();
            let _ = match self.mode {
                ProgressMode::Bar => write!(stderr, "\r{line}"),
                ProgressMode::Lines => writeln!(stderr, "{line}"),
                ProgressMode::Off => Ok(()),
            };
            let _ = stderr.flush();
            return;
        };
        let percent = (self.done * 100).checked_div(self.total).unwrap_or(100);
        let mut stderr = std::io::stderr();
        match self.mode {
            ProgressMode::Bar => {
                let width = 30u64;
                let filled = (self.done.min(self.total) * width)
                    .checked_div(self.total)
                    .unwrap_or(width) as usize;
                let _ = write!(
                    stderr,
                    "\r{} partition {} [{}{}] {}/{} records ({percent}%)",
                    self.verb,
                    partition,
                    "#".repeat(filled),
                    ".".repeat(width as usize - filled),
                    self.done,
                    self.total
                );
            }
            ProgressMode::Lines => {
                let _ = writeln!(
                    stderr,
                    "{} partition {}: {}/{} records ({percent}%)",
                    self.verb, partition, self.done, self.total
                );
            }
            ProgressMode::Off => {}
        }
        let _ = stderr.flush();
    }

    pub(crate) fn finish(&self) {
        match self.mode {
            ProgressMode::Bar => {
                self.draw();
                eprintln!();
            }
            ProgressMode::Lines => self.draw(),
            ProgressMode::Off => {}
        }
    }
}

/// Parses every time flag (`--from-time`, `--since`, `--until`; SPEC 8.2: a time is absolute or
/// a duration by its form, the same in every command): milliseconds since the Unix epoch, an
/// RFC 3339 date-time (any offset, optional fraction) checked as a real calendar date, or a
/// duration ago (`3600s`, `90m`, `24h`, `7d`; at most a year), as milliseconds since the epoch.
pub fn parse_time_ms(text: &str) -> Result<i64, String> {
    if let Some(ago) = duration_ms(text) {
        return ago.map(|ago| crate::wall_clock::now_ms_signed() - ago);
    }
    if let Ok(ms) = text.parse::<i64>() {
        return if ms >= 0 {
            Ok(ms)
        } else {
            Err("must not be negative".to_owned())
        };
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            format!("{text:?} is neither milliseconds, an RFC 3339 date-time such as 2026-02-03T04:05:06Z, nor a duration ago such as 24h: {e}")
        })
        .and_then(|ms| {
            if ms >= 0 {
                Ok(ms)
            } else {
                Err(format!("{text:?} is before 1970"))
            }
        })
}

/// A duration's milliseconds when `text` has a duration's form (digits and one unit of s, m, h,
/// d); `None` when it has another form.
fn duration_ms(text: &str) -> Option<Result<i64, String>> {
    let (number, unit) = text.split_at(text.len().checked_sub(1)?);
    let scale: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = number
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|ms| (1..=366 * 86_400_000).contains(ms));
    Some(ms.ok_or_else(|| format!("{text:?}: a duration between 1s and 366d")))
}

#[cfg(test)]
mod tests {
    use super::parse_time_ms;

    #[test]
    fn a_duration_is_that_long_ago() {
        let now = crate::wall_clock::now_ms_signed();
        for (text, ms) in [
            ("24h", 86_400_000),
            ("90m", 5_400_000),
            ("7d", 7 * 86_400_000),
            ("1s", 1_000),
            ("366d", 366 * 86_400_000),
        ] {
            let at = parse_time_ms(text).expect(text);
            assert!(
                (now - ms - 5_000..=now - ms + 5_000).contains(&at),
                "{text}: {at}"
            );
        }
        for bad in ["h", "0h", "-1h", "367d", "1.5h", "24x"] {
            assert!(parse_time_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_parse_as_ms_or_rfc3339_and_impossible_dates_are_refused() {
        assert_eq!(parse_time_ms("1764633600123"), Ok(1_764_633_600_123));
        assert_eq!(parse_time_ms("2025-12-02T00:00:00Z"), Ok(1_764_633_600_000));
        assert_eq!(parse_time_ms("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(
            parse_time_ms("2025-12-02T01:00:00+01:00"),
            Ok(1_764_633_600_000)
        );
        assert_eq!(
            parse_time_ms("2025-12-02T00:00:00.250Z"),
            Ok(1_764_633_600_250)
        );
        assert!(
            parse_time_ms("2026-02-31T00:00:00Z").is_err(),
            "no 31 February"
        );
        assert!(parse_time_ms("2025-13-02T00:00:00Z").is_err());
        assert!(parse_time_ms("yesterday").is_err());
        assert!(parse_time_ms("-5").is_err());
    }
}
