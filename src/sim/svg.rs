//! Small hand-written SVG charts: a line chart and a bar chart, readable without any viewer
//! beyond a browser.

use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn frame(out: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>
"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title),
        (LEFT + W - RIGHT) / 2.0,
        H - 14.0,
        esc(x_label),
        (TOP + H - BOTTOM) / 2.0,
        esc(y_label),
    );
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Lines over a shared x axis; each series is (name, points).
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    x_range: (f64, f64),
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let y_max = nice_max(
        series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let (x0, x1) = x_range;
    let px = |x: f64| LEFT + (x - x0) / (x1 - x0).max(1e-9) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - y / y_max * (H - TOP - BOTTOM);
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label);
    y_grid(&mut out, y_max, py);
    for i in 0..=5 {
        let x = x0 + (x1 - x0) * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            px(x),
            H - BOTTOM + 18.0,
            trim(x)
        );
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT + 10.0,
            W - RIGHT + 30.0,
            W - RIGHT + 36.0,
            ly + 4.0,
            esc(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// Grouped bars: one group per category, one bar per series.
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let y_max = nice_max(
        series
            .iter()
            .flat_map(|s| s.1.iter().copied())
            .fold(0.0, f64::max),
    );
    let py = |y: f64| H - BOTTOM - y / y_max * (H - TOP - BOTTOM);
    let mut out = String::new();
    frame(&mut out, title, "", y_label);
    y_grid(&mut out, y_max, py);
    let group_w = (W - LEFT - RIGHT) / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        let gx = LEFT + group_w * c as f64 + group_w * 0.1;
        for (s, (_, vals)) in series.iter().enumerate() {
            let v = vals.get(c).copied().unwrap_or(0.0);
            let x = gx + bar_w * s as f64;
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                py(v),
                bar_w * 0.9,
                (H - BOTTOM - py(v)).max(0.0),
                COLORS[s % COLORS.len()],
                trim(v),
                x + bar_w * 0.45,
                py(v) - 3.0,
                trim(v)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            gx + group_w * 0.4,
            H - BOTTOM + 18.0,
            esc(cat)
        );
    }
    for (i, (name, _)) in series.iter().enumerate() {
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{}" width="14" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT + 10.0,
            ly - 5.0,
            COLORS[i % COLORS.len()],
            W - RIGHT + 30.0,
            ly + 4.0,
            esc(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

fn trim(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", crate::convert::f64_to_i64(v.round()))
    } else {
        format!("{v:.1}")
    }
}

/// Six horizontal grid lines with their values on the left axis, shared by every chart.
fn y_grid(out: &mut String, y_max: f64, py: impl Fn(f64) -> f64) {
    for i in 0..=5 {
        let y = y_max * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            py(y),
            py(y),
            LEFT - 6.0,
            py(y) + 4.0,
            trim(y)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let l = line_chart(
            "t<1>",
            "x",
            "y",
            (0.0, 130.0),
            &[("a".into(), vec![(0.0, 1.0), (130.0, 5.0)])],
        );
        assert!(l.starts_with("<svg") && l.trim_end().ends_with("</svg>"));
        assert!(l.contains("t&lt;1&gt;"));
        assert_eq!(l.matches("<polyline").count(), 1);
        let b = bar_chart(
            "b",
            "y",
            &["c1".into(), "c2".into()],
            &[("s".into(), vec![1.0, 2.0])],
        );
        assert_eq!(b.matches("<rect x=").count(), 2 + 1);
    }
}
