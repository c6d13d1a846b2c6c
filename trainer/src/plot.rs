//! The curves of a run as a PNG (`OUT/metrics.png`), drawn with plotters' bitmap backend. plotters'
//! text needs a font library, so the labels are drawn pixel by pixel with the public-domain 8×8 bitmap
//! font of `font8x8` instead: each panel has its title, its y range (min and max) and its step range.

use std::path::Path;

use plotters::prelude::*;

/// A named curve: its name, colour and points.
pub type Series = (String, RGBColor, Vec<(f64, f64)>);

/// One panel: a title and its series.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

pub const WIDTH: u32 = 1000;
pub const HEIGHT: u32 = 700;

const TEXT: RGBColor = RGBColor(30, 30, 30);
const GRID: RGBColor = RGBColor(225, 225, 225);
pub const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draw `text` with its top-left corner at `(x, y)`, each font pixel `scale` pixels wide.
fn text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    x: i32,
    y: i32,
    text: &str,
    scale: i32,
    color: &RGBColor,
) {
    for (i, c) in text.chars().enumerate() {
        let glyph = font8x8::legacy::BASIC_LEGACY
            .get(c as usize)
            .copied()
            .unwrap_or([0; 8]);
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    for dy in 0..scale {
                        for dx in 0..scale {
                            let px = x + (i as i32 * 8 + col) * scale + dx;
                            let py = y + row as i32 * scale + dy;
                            let _ = area.draw_pixel((px, py), color);
                        }
                    }
                }
            }
        }
    }
}

fn number(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 || v.abs() < 0.01 {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
    }
}

/// Write the panels (a grid of two columns) to `path` as a `WIDTH`×`HEIGHT` PNG.
pub fn write_png(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    text(&root, 10, 8, title, 2, &TEXT);
    let body = root.margin(32, 0, 0, 0);
    let rows = panels.len().div_ceil(2).max(1);
    let cells = body.split_evenly((rows, 2));
    for (panel, cell) in panels.iter().zip(&cells) {
        let points = panel.series.iter().flat_map(|s| s.2.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
            x0 = x0.min(*x);
            x1 = x1.max(*x);
            y0 = y0.min(*y);
            y1 = y1.max(*y);
        }
        text(cell, 70, 4, &panel.title, 1, &TEXT);
        if x0 > x1 {
            text(cell, 70, 40, "(no data)", 1, &TEXT);
            continue;
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            let pad = if y0 == 0.0 { 1.0 } else { y0.abs() * 0.1 };
            y0 -= pad;
            y1 += pad;
        }
        let mut chart = ChartBuilder::on(cell)
            .margin_top(18)
            .margin_right(16)
            .margin_bottom(22)
            .margin_left(68)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| fail(&e))?;
        for k in 0..=4 {
            let y = y0 + (y1 - y0) * k as f64 / 4.0;
            chart
                .draw_series(LineSeries::new([(x0, y), (x1, y)], GRID))
                .map_err(|e| fail(&e))?;
        }
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, y0), (x1, y1)],
                BLACK.stroke_width(1),
            )))
            .map_err(|e| fail(&e))?;
        for (k, (name, color, points)) in panel.series.iter().enumerate() {
            let finite: Vec<(f64, f64)> = points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            if finite.len() == 1 {
                chart
                    .draw_series(std::iter::once(Circle::new(finite[0], 3, color.filled())))
                    .map_err(|e| fail(&e))?;
            } else {
                chart
                    .draw_series(LineSeries::new(finite, color.stroke_width(2)))
                    .map_err(|e| fail(&e))?;
            }
            if panel.series.len() > 1 {
                let (lx, ly) = chart.backend_coord(&(x0, y1));
                text(&root, lx + 6, ly + 6 + 10 * k as i32, name, 1, color);
            }
        }
        // Labels, in root coordinates (the chart's backend coordinates are absolute).
        let (bx, by) = chart.backend_coord(&(x0, y0));
        let (tx, ty) = chart.backend_coord(&(x1, y1));
        let top = number(y1);
        let bottom = number(y0);
        text(&root, bx - 4 - 8 * top.len() as i32, ty - 4, &top, 1, &TEXT);
        text(
            &root,
            bx - 4 - 8 * bottom.len() as i32,
            by - 4,
            &bottom,
            1,
            &TEXT,
        );
        let left = format!("{x0:.0}");
        let right = format!("step {x1:.0}");
        text(&root, bx, by + 6, &left, 1, &TEXT);
        text(&root, tx - 8 * right.len() as i32, by + 6, &right, 1, &TEXT);
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_of_the_documented_size() {
        let dir = std::env::temp_dir().join(format!("rlx-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("curves.png");
        let line: Vec<(f64, f64)> = (0..20).map(|i| (i as f64, (i as f64).sin())).collect();
        let panels = vec![
            Panel {
                title: "reward/mean".into(),
                series: vec![("reward".into(), COLORS[0], line.clone())],
            },
            Panel {
                title: "accuracy".into(),
                series: vec![
                    ("train".into(), COLORS[0], line),
                    ("eval".into(), COLORS[1], vec![(5.0, 0.5)]),
                ],
            },
            Panel {
                title: "empty".into(),
                series: vec![],
            },
        ];
        write_png(&path, "rlx run", &panels).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&bytes[12..16], b"IHDR");
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((width, height), (WIDTH, HEIGHT));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
