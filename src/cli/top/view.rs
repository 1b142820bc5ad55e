//! How a [`Snapshot`] reads: the same two tables on the terminal UI (ratatui) and as plain text
//! (`top --once`), so what a script captures is what a person sees.

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;

use super::snapshot::{Filter, Order, PartitionView, ReplicaView, Snapshot};

const REPLICA_HEADER: [&str; 8] = [
    "REPLICA",
    "STATE",
    "REC/S",
    "DLQ/S",
    "STORE ERR/S",
    "P50 MS",
    "P99 MS",
    "WHY",
];
const PARTITION_HEADER: [&str; 8] = [
    "REPLICA",
    "PARTITION",
    "LAG",
    "LAG S",
    "COMMIT/S",
    "BLOCKED",
    "UNREADABLE",
    "WHY",
];

fn rate(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn sum(map: &std::collections::BTreeMap<String, f64>) -> f64 {
    // From +0.0: an empty float `sum()` is -0.0, printed "-0.0".
    map.values().fold(0.0, |total, v| total + v)
}

/// A map as `k=v k=v`, nonzero entries only (`-` when none).
fn by_key(map: &std::collections::BTreeMap<String, f64>) -> String {
    let parts: Vec<String> = map
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k}={}", rate(*v)))
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(" ")
    }
}

fn millis(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "-".to_owned(), |s| format!("{:.1}", s * 1000.0))
}

fn replica_cells(r: &ReplicaView) -> [String; 8] {
    let state = match (r.state, r.down_for_seconds) {
        ("down", Some(secs)) => format!("DOWN {secs}s"),
        ("down", None) => "DOWN".to_owned(),
        ("not_ready", _) => "NOT READY".to_owned(),
        (state, _) => state.to_owned(),
    };
    let mut why = r.why.join("; ");
    if r.blocked_mailboxes > 0 {
        if !why.is_empty() {
            why.push_str("; ");
        }
        why.push_str(&format!("{} blocked mailbox(es)", r.blocked_mailboxes));
    }
    let records = if r.state == "down" {
        "-".to_owned()
    } else {
        format!(
            "{} ({})",
            rate(sum(&r.records_per_second)),
            by_key(&r.records_per_second)
        )
    };
    [
        r.replica.clone(),
        state,
        records,
        by_key(&r.dead_letters_per_second),
        by_key(&r.store_errors_per_second),
        millis(r.store_call_p50_seconds),
        millis(r.store_call_p99_seconds),
        if why.is_empty() { "-".to_owned() } else { why },
    ]
}

fn partition_cells(p: &PartitionView) -> [String; 8] {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    [
        p.replica.clone(),
        p.partition.to_string(),
        or_dash(p.lag_records.map(|l| l.to_string())),
        or_dash(p.lag_seconds.map(|s| format!("{s:.0}"))),
        or_dash(p.committed_per_second.map(rate)),
        p.blocked_mailboxes.to_string(),
        if p.unreadable { "yes" } else { "no" }.to_owned(),
        p.why.clone(),
    ]
}

fn title(snapshot: &Snapshot, order: Order, filter: Filter) -> String {
    let down = snapshot
        .replicas
        .iter()
        .filter(|r| r.state == "down")
        .count();
    let not_ready = snapshot
        .replicas
        .iter()
        .filter(|r| r.state == "not_ready")
        .count();
    format!(
        "materializer top: {} replica(s), {} not ready, {} down | sort: {} (s) | filter: {} (f) | q quits",
        snapshot.replicas.len(),
        not_ready,
        down,
        order.name(),
        filter.name()
    )
}

/// Draws the snapshot on the terminal.
pub(super) fn draw(frame: &mut Frame<'_>, snapshot: &Snapshot, order: Order, filter: Filter) {
    let replicas = snapshot.replicas.len() as u16;
    let [head, top, bottom] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(replicas + 3),
        Constraint::Min(3),
    ])
    .areas(frame.area());
    frame.render_widget(
        Paragraph::new(Line::from(title(snapshot, order, filter)))
            .style(Style::default().add_modifier(Modifier::BOLD)),
        head,
    );
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = snapshot.replicas.iter().map(|r| {
        let style = match r.state {
            "down" => Style::default().fg(Color::Red),
            "not_ready" => Style::default().fg(Color::Yellow),
            _ => Style::default(),
        };
        Row::new(replica_cells(r)).style(style)
    });
    // The rate columns list a value per outcome, reason or kind: wide enough for the usual ones.
    let widths = [
        Constraint::Length(22),
        Constraint::Length(10),
        Constraint::Length(48),
        Constraint::Length(28),
        Constraint::Length(24),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Min(20),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(Row::new(REPLICA_HEADER).style(bold))
            .block(Block::bordered().title("replicas")),
        top,
    );
    let rows = snapshot.partitions.iter().map(|p| {
        let style = if p.blocked_mailboxes > 0 || p.unreadable {
            Style::default().fg(Color::Red)
        } else {
            Style::default()
        };
        Row::new(partition_cells(p)).style(style)
    });
    let widths = [
        Constraint::Length(22),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Min(20),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(Row::new(PARTITION_HEADER).style(bold))
            .block(Block::bordered().title("partitions, worst first")),
        bottom,
    );
}

/// The snapshot as plain text: the title and both tables, columns aligned.
pub(super) fn text(snapshot: &Snapshot, order: Order, filter: Filter) -> String {
    let mut out = title(snapshot, order, filter);
    out.push_str("\n\n");
    let replicas: Vec<Vec<String>> = snapshot
        .replicas
        .iter()
        .map(|r| replica_cells(r).to_vec())
        .collect();
    out.push_str(&aligned(&REPLICA_HEADER, &replicas));
    out.push('\n');
    let partitions: Vec<Vec<String>> = snapshot
        .partitions
        .iter()
        .map(|p| partition_cells(p).to_vec())
        .collect();
    out.push_str(&aligned(&PARTITION_HEADER, &partitions));
    out
}

fn aligned(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}
