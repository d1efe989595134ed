//! The lag chart: an SVG drawn on the server from the samples kept in
//! memory (presentation attributes only: the Content-Security-Policy
//! allows no inline style).

use maud::{Markup, html};

use crate::state::Series;

const W: f64 = 720.0;
const H: f64 = 180.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 24.0;

const COLORS: [&str; 6] = [
    "#1f5fbf", "#b3261e", "#1a7f37", "#9a6700", "#6639ba", "#0b7285",
];

/// One line per series, over the span of the samples; the legend names
/// each line.
pub(crate) fn lag_chart(title: &str, lines: &[(String, Series)], now_ms: u64) -> Markup {
    let start = lines
        .iter()
        .filter_map(|(_, s)| s.front().map(|(t, _)| *t))
        .min()
        .unwrap_or(now_ms);
    let end = now_ms.max(start + 1000);
    let max = lines
        .iter()
        .flat_map(|(_, s)| s.iter().map(|(_, v)| *v))
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |t: u64| {
        LEFT + (t.saturating_sub(start)) as f64 / (end - start) as f64 * (W - LEFT - RIGHT)
    };
    let y = |v: i64| TOP + (1.0 - v.max(0) as f64 / max as f64) * (H - TOP - BOTTOM);
    let span_s = (end - start) / 1000;
    let samples: usize = lines.iter().map(|(_, s)| s.len()).sum();
    html! {
        svg class="chart" xmlns="http://www.w3.org/2000/svg" width=(W) height=(H + 18.0 * lines.len() as f64)
            viewBox=(format!("0 0 {W} {}", H + 18.0 * lines.len() as f64)) role="img" aria-label=(title) {
            title { (title) }
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(H - BOTTOM) stroke="#99a3ad" {}
            line x1=(LEFT) y1=(H - BOTTOM) x2=(W - RIGHT) y2=(H - BOTTOM) stroke="#99a3ad" {}
            text x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" font-size="11" fill="#5d6875" { (max) }
            text x=(LEFT - 6.0) y=(H - BOTTOM) text-anchor="end" font-size="11" fill="#5d6875" { "0" }
            text x=(LEFT) y=(H - 6.0) font-size="11" fill="#5d6875" { (format!("−{span_s} s")) }
            text x=(W - RIGHT) y=(H - 6.0) text-anchor="end" font-size="11" fill="#5d6875" { "now" }
            @if samples == 0 {
                text x=(W / 2.0) y=(H / 2.0) text-anchor="middle" font-size="12" fill="#5d6875" { "no samples yet" }
            }
            @for (i, (label, series)) in lines.iter().enumerate() {
                @let color = COLORS[i % COLORS.len()];
                @let points = series.iter().map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v))).collect::<Vec<_>>().join(" ");
                polyline points=(points) fill="none" stroke=(color) stroke-width="2" {}
                @if let Some((t, v)) = series.back() {
                    circle cx=(format!("{:.1}", x(*t))) cy=(format!("{:.1}", y(*v))) r="3" fill=(color) {}
                }
                rect x=(LEFT) y=(H + 18.0 * i as f64 + 2.0) width="10" height="10" fill=(color) {}
                text x=(LEFT + 16.0) y=(H + 18.0 * i as f64 + 11.0) font-size="12" fill="#1d232a" {
                    (label) ": " (series.back().map_or_else(|| "?".to_owned(), |(_, v)| v.to_string()))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_points_drawn() {
        let series: Series = [(1_000, 5), (6_000, 2)].into_iter().collect();
        let svg = lag_chart("lag", &[("<b>h</b>".to_owned(), series)], 6_000).into_string();
        assert!(svg.contains("&lt;b&gt;h&lt;/b&gt;: 2"), "{svg}");
        assert!(svg.contains("<polyline points=\""), "{svg}");
        assert!(!svg.contains("<b>"), "{svg}");
    }
}
