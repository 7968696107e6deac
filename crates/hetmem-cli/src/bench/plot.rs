//! SVG plots of benchmark results, drawn with plotters' SVG backend (text stays `<text>`, so no
//! fonts are read from the system).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use hetmem_bench::Summary;
use plotters::prelude::*;

const SIZE: (u32, u32) = (960, 600);

/// Named series of (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

fn fail(path: &Path) -> impl Fn(String) -> anyhow::Error + '_ {
    move |error| anyhow!("drawing {}: {error}", path.display())
}

/// One line per series, x on a log scale (sizes), y linear or log.
pub fn lines(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    log_y: bool,
) -> anyhow::Result<PathBuf> {
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0) {
        (x_min, x_max, y_min, y_max) = (x_min.min(x), x_max.max(x), y_min.min(y), y_max.max(y));
    }
    if x_min > x_max {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let x_range = (x_min / 1.5..x_max * 1.5).log_scale().base(4.0);
    let fail = fail(path);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, ("sans-serif", 22)).margin(16).x_label_area_size(48).y_label_area_size(72);
    // Ticks fall on powers of 4; anything else stays unlabelled rather than read `5120 B`.
    let format_x = |x: &f64| {
        let bytes = x.round() as usize;
        if bytes.is_power_of_two() { hetmem_bench::sizes::format(bytes) } else { String::new() }
    };
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_label_formatter(&format_x)
                .draw()
                .map_err(|e| fail(e.to_string()))?;
            for (index, (name, points)) in series.iter().enumerate() {
                let color = Palette99::pick(index).to_rgba();
                chart
                    .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| fail(e.to_string()))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart
                    .draw_series(points.iter().map(|&point| Circle::new(point, 3, color.filled())))
                    .map_err(|e| fail(e.to_string()))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| fail(e.to_string()))?;
        }};
    }
    if log_y {
        let y_range = (y_min.max(1e-9) / 1.5..y_max * 1.5).log_scale();
        draw!(builder.build_cartesian_2d(x_range, y_range).map_err(|e| fail(e.to_string()))?);
    } else {
        draw!(builder.build_cartesian_2d(x_range, 0.0..y_max * 1.1).map_err(|e| fail(e.to_string()))?);
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(path.to_path_buf())
}

/// One column per named distribution: a bar from the fastest to the 99th percentile, marks at
/// the median (filled) and the 90th percentile (open), y on a log scale.
pub fn spread(
    path: &Path,
    title: &str,
    y_desc: &str,
    items: &[(String, Summary)],
) -> anyhow::Result<PathBuf> {
    if items.is_empty() {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let y_min = items.iter().map(|(_, s)| s.min).fold(f64::MAX, f64::min).max(1e-9);
    let y_max = items.iter().map(|(_, s)| s.p99).fold(f64::MIN, f64::max).max(y_min * 2.0);
    let fail = fail(path);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let names: Vec<&str> = items.iter().map(|(name, _)| name.as_str()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(140)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5..items.len() as f64 - 0.5, (y_min / 1.5..y_max * 1.5).log_scale())
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(items.len())
        .x_label_formatter(&|x: &f64| {
            let index = x.round();
            if (x - index).abs() < 0.01 && index >= 0.0 {
                names.get(index as usize).map_or(String::new(), ToString::to_string)
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 12).into_font().transform(FontTransform::Rotate90))
        .y_desc(y_desc)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    for (index, (_, summary)) in items.iter().enumerate() {
        let x = index as f64;
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, summary.min), (x, summary.p99)],
                color.stroke_width(3),
            )))
            .map_err(|e| fail(e.to_string()))?;
        chart
            .draw_series([
                Circle::new((x, summary.median), 6, color.filled()),
                Circle::new((x, summary.p90), 5, color.stroke_width(2)),
            ])
            .map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(path.to_path_buf())
}

/// Creates `dir` and returns `dir/name`.
pub fn file_in(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.join(name))
}

#[cfg(test)]
mod tests {
    use hetmem_bench::Summary;

    use super::{lines, spread};

    fn summary(median: f64) -> Summary {
        Summary { samples: 5, min: median * 0.8, median, p90: median * 1.2, p99: median * 1.5 }
    }

    #[test]
    fn spread_labels_every_column_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "pinned_sync_h2d",
            "pinned_async_h2d",
            "zero_copy_kernel_read",
            "file_kernel_read",
            "doorbell",
            "x",
        ];
        let items: Vec<_> =
            names.iter().enumerate().map(|(i, n)| (n.to_string(), summary(2.0 + i as f64))).collect();
        let file = spread(&dir.path().join("spread.svg"), "spread", "us", &items).unwrap();
        let svg = std::fs::read_to_string(file).unwrap();
        for name in names {
            assert!(svg.contains(&format!(">\n{name}\n<")), "{name} is not a label");
        }
    }

    #[test]
    fn lines_draw_each_series_with_a_legend_entry_and_size_labels() {
        let dir = tempfile::tempdir().unwrap();
        let series = vec![
            ("zero_copy_read".to_string(), vec![(4096.0, 3.0), (1048576.0, 40.0), (1073741824.0, 51.0)]),
            ("pinned_async_h2d".to_string(), vec![(4096.0, 5.0), (1048576.0, 45.0), (1073741824.0, 55.0)]),
        ];
        let file = lines(&dir.path().join("lines.svg"), "bw", ("bytes", "GB/s"), &series, false).unwrap();
        let svg = std::fs::read_to_string(file).unwrap();
        assert!(svg.contains("zero_copy_read") && svg.contains("pinned_async_h2d"));
        assert!(svg.matches("<polyline").count() >= 2, "one line per series");
        assert!(svg.contains("MiB") || svg.contains("GiB") || svg.contains("KiB"), "sizes label the x axis");
        assert!(lines(&dir.path().join("empty.svg"), "bw", ("bytes", "GB/s"), &[], false).is_err());
    }
}
