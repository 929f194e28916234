//! A small SVG line plot: bandwidth against object size, both axes logarithmic, one polyline
//! per system. Hand-written so it needs no fonts or image libraries.

use std::fmt::Write;

/// One line of the plot: (size in bytes, MB/s) points.
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in size order.
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn size_label(bytes: f64) -> String {
    skyriver_daemon::size::format_bytes(bytes as u64)
}

/// Renders the series as an SVG document.
pub fn svg(title: &str, series: &[Series]) -> String {
    let points = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(x, y)| *x > 0.0 && *y > 0.0);
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x_min = x_min.min(x.log2());
        x_max = x_max.max(x.log2());
        y_min = y_min.min(y.log10());
        y_max = y_max.max(y.log10());
    }
    if x_min > x_max {
        (x_min, x_max, y_min, y_max) = (10.0, 20.0, 0.0, 4.0);
    }
    let (x_min, x_max) = (x_min.floor(), x_max.ceil().max(x_min.floor() + 1.0));
    let (y_min, y_max) = (y_min.floor(), y_max.ceil().max(y_min.floor() + 1.0));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x.log2() - x_min) / (x_max - x_min) * plot_w;
    let py = |y: f64| TOP + plot_h - (y.log10() - y_min) / (y_max - y_min) * plot_h;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid and tick labels: every power of four in size, every decade in MB/s.
    let mut exponent = x_min as i64;
    while exponent as f64 <= x_max {
        let x = px(2f64.powi(exponent as i32));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            size_label(2f64.powi(exponent as i32))
        );
        exponent += 2;
    }
    let mut decade = y_min as i64;
    while decade as f64 <= y_max {
        let y = py(10f64.powi(decade as i32));
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            10f64.powi(decade as i32)
        );
        decade += 1;
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">object size</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">bandwidth, MB/s (log)</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let coordinates: Vec<String> = line
            .points
            .iter()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let dash = if line.name.starts_with("skyriver") {
            ""
        } else {
            r#" stroke-dasharray="6 4""#
        };
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
            coordinates.join(" ")
        );
        for point in &coordinates {
            let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
        let legend_y = TOP + 10.0 + index as f64 * 20.0;
        let legend_x = LEFT + plot_w + 15.0;
        let _ = writeln!(
            out,
            r#"<line x1="{legend_x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            legend_x + 25.0,
            legend_x + 32.0,
            legend_y + 4.0,
            escape(&line.name)
        );
    }
    out.push_str("</svg>\n");
    out
}
