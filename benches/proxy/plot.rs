//! A grouped bar chart of ratios, drawn into an RGB buffer and written as PNG.
//!
//! Text uses the public-domain 8×8 bitmap font of `font8x8`, so nothing depends on system font
//! libraries. Each panel has one group of bars per query (one bar per scale), the value above each
//! bar, a red tick at the query's target ratio and a grey line at 1× (the baseline). Bars taller
//! than the axis are cut at its top, with their value still printed.

use std::path::Path;

use font8x8::{UnicodeFonts, BASIC_FONTS};

/// What to draw.
pub struct Data {
    pub panels: Vec<Panel>,
}

/// One chart: a title, the series names (one colour each) and the groups of bars.
pub struct Panel {
    pub title: String,
    pub series: Vec<String>,
    pub groups: Vec<Group>,
}

/// One query: its label, its target ratio and one value per series.
pub struct Group {
    pub label: String,
    pub target: f64,
    pub values: Vec<f64>,
}

type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GREY: Rgb = [160, 160, 160];
const LIGHT: Rgb = [225, 225, 225];
const RED: Rgb = [210, 30, 30];
const COLOURS: [Rgb; 4] = [
    [70, 110, 190],
    [235, 140, 40],
    [90, 160, 90],
    [150, 90, 170],
];

const WIDTH: usize = 960;
const PANEL_HEIGHT: usize = 330;
/// Highest ratio on the axis; taller bars are cut.
const AXIS_MAX_CAP: f64 = 8.0;

struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            pixels: WHITE.repeat(width * height),
        }
    }

    fn rect(&mut self, x: usize, y: usize, w: usize, h: usize, colour: Rgb) {
        for yy in y..(y + h).min(self.height) {
            for xx in x..(x + w).min(self.width) {
                let i = (yy * self.width + xx) * 3;
                self.pixels[i..i + 3].copy_from_slice(&colour);
            }
        }
    }

    /// Text at (x, y), top-left, with each font pixel drawn as `scale`×`scale`.
    fn text(&mut self, x: usize, y: usize, text: &str, scale: usize, colour: Rgb) {
        for (n, c) in text.chars().enumerate() {
            let glyph = BASIC_FONTS.get(c).unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.rect(
                            x + (n * 8 + col) * scale,
                            y + row * scale,
                            scale,
                            scale,
                            colour,
                        );
                    }
                }
            }
        }
    }

    fn text_centered(&mut self, cx: usize, y: usize, text: &str, scale: usize, colour: Rgb) {
        let w = text.chars().count() * 8 * scale;
        self.text(cx.saturating_sub(w / 2), y, text, scale, colour);
    }
}

fn axis_max(panel: &Panel) -> f64 {
    let top = panel
        .groups
        .iter()
        .flat_map(|g| g.values.iter().copied().chain([g.target]))
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max);
    (top * 1.15).ceil().min(AXIS_MAX_CAP)
}

fn draw_panel(c: &mut Canvas, top: usize, panel: &Panel) {
    let (left, right) = (60, WIDTH - 20);
    let (plot_top, plot_bottom) = (top + 40, top + PANEL_HEIGHT - 40);
    let height = (plot_bottom - plot_top) as f64;
    let max = axis_max(panel);
    let y_of = |v: f64| plot_bottom - ((v.clamp(0.0, max) / max) * height) as usize;
    c.text(left, top + 10, &panel.title, 2, BLACK);
    // Legend, right-aligned.
    let mut x = right;
    for (i, name) in panel.series.iter().enumerate().rev() {
        x -= name.len() * 8 + 24;
        c.rect(x, top + 14, 10, 10, COLOURS[i % COLOURS.len()]);
        c.text(x + 14, top + 15, name, 1, BLACK);
    }
    // Grid and y labels at every whole ratio.
    let step = if max > 4.0 { 1.0 } else { 0.5 };
    let mut v = 0.0;
    while v <= max + 1e-9 {
        let y = y_of(v);
        c.rect(
            left,
            y,
            right - left,
            1,
            if v == 1.0 { GREY } else { LIGHT },
        );
        c.text(8, y.saturating_sub(4), &format!("{v:.1}X"), 1, BLACK);
        v += step;
    }
    c.rect(left, plot_top, 1, plot_bottom - plot_top, BLACK);
    c.rect(left, plot_bottom, right - left, 1, BLACK);
    let groups = panel.groups.len().max(1);
    let slot = (right - left) / groups;
    let bars = panel.series.len().max(1);
    let bar = ((slot * 2 / 3) / bars).min(60);
    for (g, group) in panel.groups.iter().enumerate() {
        let x0 = left + g * slot + (slot - bar * bars) / 2;
        for (i, value) in group.values.iter().enumerate() {
            let x = x0 + i * bar;
            if value.is_finite() {
                let y = y_of(*value);
                c.rect(
                    x + 2,
                    y,
                    bar - 4,
                    plot_bottom - y,
                    COLOURS[i % COLOURS.len()],
                );
                let label = if *value >= 100.0 {
                    format!("{value:.0}")
                } else {
                    format!("{value:.2}")
                };
                c.text_centered(
                    x + bar / 2,
                    y.saturating_sub(10).max(plot_top - 10),
                    &label,
                    1,
                    BLACK,
                );
            }
        }
        // Target: a red tick across the group.
        let y = y_of(group.target);
        c.rect(x0.saturating_sub(6), y, bar * bars + 12, 2, RED);
        c.text_centered(
            left + g * slot + slot / 2,
            plot_bottom + 8,
            &group.label,
            1,
            BLACK,
        );
        c.text_centered(
            left + g * slot + slot / 2,
            plot_bottom + 20,
            &format!("TARGET {:.2}X", group.target),
            1,
            RED,
        );
    }
}

/// Draws every panel, one under the other, and writes the PNG.
pub fn ratios(path: &Path, data: &Data) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let height = PANEL_HEIGHT * data.panels.len().max(1);
    let mut canvas = Canvas::new(WIDTH, height);
    for (i, panel) in data.panels.iter().enumerate() {
        draw_panel(&mut canvas, i * PANEL_HEIGHT, panel);
    }
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut encoder = png::Encoder::new(file, WIDTH as u32, height as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&canvas.pixels)?;
    writer.finish()?;
    Ok(())
}
