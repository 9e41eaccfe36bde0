//! SVG plots of a [`RunResult`]: throughput over time (sent and stored), the publish-to-ack
//! latency distribution (percentile curve), stored throughput per broker core, and the broker's
//! p99 per core over time.

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::prelude::*;

use crate::report::RunResult;

/// Plot size in pixels.
const SIZE: (u32, u32) = (900, 480);
/// Colours of successive series.
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A named line.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Draws every plot of `r` into `dir`; returns the files written.
pub fn draw_all(r: &RunResult, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let w = Some(r.config.warmup_s);
    let mut files = Vec::new();
    let t = |s: &crate::report::Second| s.t_s;
    let dt = |i: usize| {
        let prev = if i == 0 { 0.0 } else { r.timeline[i - 1].t_s };
        (r.timeline[i].t_s - prev).max(1e-3)
    };
    let mut stored = Vec::new();
    let sent: Vec<(f64, f64)> = r
        .timeline
        .iter()
        .enumerate()
        .map(|(i, s)| (t(s), s.sent_bytes as f64 / 1e6 / dt(i)))
        .collect();
    let cores = r.timeline.iter().map(|s| s.stored_bytes_per_core.len()).max().unwrap_or(0);
    if cores > 0 {
        stored = r
            .timeline
            .iter()
            .enumerate()
            .map(|(i, s)| (t(s), s.stored_bytes_per_core.iter().sum::<u64>() as f64 / 1e6 / dt(i)))
            .collect();
    }
    let path = dir.join("throughput.svg");
    let mut series = vec![Series { name: "client sent MB/s".into(), points: sent }];
    if !stored.is_empty() {
        series.push(Series { name: "broker stored MB/s".into(), points: stored });
    }
    lines(&path, &format!("{}: throughput over time", r.config.label), "s", "MB/s", &series, w)?;
    files.push(path);

    let h = r.ack.histogram()?;
    if !h.is_empty() {
        // x: -log10(1 - q) so 90, 99, 99.9 % are evenly spaced.
        let mut points = Vec::new();
        for i in 0..=400 {
            let x = f64::from(i) / 100.0;
            let q = 1.0 - 10f64.powf(-x);
            points.push((x, h.value_at_quantile(q) as f64 / 1000.0));
        }
        let path = dir.join("latency.svg");
        lines(
            &path,
            &format!("{}: publish-to-ack latency (x: 1=90%, 2=99%, 3=99.9%)", r.config.label),
            "nines",
            "ms",
            &[Series { name: "publish-to-ack".into(), points }],
            None,
        )?;
        files.push(path);
    }

    if cores > 0 {
        let per_core: Vec<Series> = (0..cores)
            .map(|c| Series {
                name: format!("core {c} stored MB/s"),
                points: r
                    .timeline
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        (
                            t(s),
                            s.stored_bytes_per_core.get(c).copied().unwrap_or(0) as f64
                                / 1e6
                                / dt(i),
                        )
                    })
                    .collect(),
            })
            .collect();
        let path = dir.join("per_core_throughput.svg");
        lines(
            &path,
            &format!("{}: stored per broker core", r.config.label),
            "s",
            "MB/s",
            &per_core,
            w,
        )?;
        files.push(path);
        let p99: Vec<Series> = (0..cores)
            .map(|c| Series {
                name: format!("core {c} broker p99"),
                points: r
                    .timeline
                    .iter()
                    .filter_map(|s| {
                        Some((t(s), *s.broker_ack_p99_us_per_core.get(c)? as f64 / 1000.0))
                    })
                    .collect(),
            })
            .collect();
        let path = dir.join("per_core_p99.svg");
        lines(
            &path,
            &format!("{}: broker publish-to-ack p99 per core", r.config.label),
            "s",
            "ms",
            &p99,
            w,
        )?;
        files.push(path);
    }
    if r.timeline.iter().any(|s| s.broker_rss_bytes.is_some()) {
        let rss = Series {
            name: "broker RSS MiB".into(),
            points: r
                .timeline
                .iter()
                .filter_map(|s| Some((t(s), s.broker_rss_bytes? as f64 / 1048576.0)))
                .collect(),
        };
        let path = dir.join("broker_rss.svg");
        lines(&path, &format!("{}: broker RSS", r.config.label), "s", "MiB", &[rss], w)?;
        files.push(path);
    }
    Ok(files)
}

fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    window_start_s: Option<f64>,
) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (1e-9f64, 1e-9f64);
    let mut y_min = f64::MAX;
    for (x, y) in all {
        x_max = x_max.max(*x);
        y_max = y_max.max(*y);
        y_min = y_min.min(*y);
    }
    let y_low = if y_min == f64::MAX { 0.0 } else { 0.0f64.min(y_min) };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max * 1.02, y_low..y_max * 1.1)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw().map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
            });
    }
    if let Some(x) = window_start_s.filter(|x| *x > 0.0) {
        chart
            .draw_series(LineSeries::new(
                [(x, y_low), (x, y_max * 1.1)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(|e| err(&e))?
            .label("measured window starts")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.mix(0.5)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
