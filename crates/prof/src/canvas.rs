//! A small RGB raster for plots: rectangles, lines, markers and 8×8 bitmap text, written
//! out as PNG.

use font8x8::legacy::BASIC_LEGACY;

pub type Rgb = [u8; 3];

pub const WHITE: Rgb = [255, 255, 255];
pub const BLACK: Rgb = [0, 0, 0];
pub const GREY: Rgb = [190, 190, 190];

/// Pixels of one glyph cell at scale 1.
pub const GLYPH: i32 = 8;

pub struct Canvas {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

impl Canvas {
    pub fn new(width: u32, height: u32) -> Canvas {
        Canvas {
            width,
            height,
            pixels: WHITE.repeat(width as usize * height as usize),
        }
    }

    /// Set one pixel; outside the canvas nothing happens.
    pub fn put(&mut self, x: i32, y: i32, c: Rgb) {
        if x < 0 || y < 0 || x >= self.width as i32 || y >= self.height as i32 {
            return;
        }
        let at = 3 * (y as usize * self.width as usize + x as usize);
        self.pixels[at..at + 3].copy_from_slice(&c);
    }

    pub fn fill_rect(&mut self, x: i32, y: i32, w: i32, h: i32, c: Rgb) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.put(xx, yy, c);
            }
        }
    }

    /// A line from `(x0, y0)` to `(x1, y1)`; `dash` > 0 draws `dash` pixels on, `dash` off.
    pub fn line(&mut self, (x0, y0): (i32, i32), (x1, y1): (i32, i32), c: Rgb, dash: u32) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err, mut n) = (x0, y0, dx + dy, 0u32);
        loop {
            if dash == 0 || (n / dash).is_multiple_of(2) {
                self.put(x, y, c);
            }
            n += 1;
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// A filled diamond of radius `r` centred on `(x, y)`, outlined in black.
    pub fn marker(&mut self, x: i32, y: i32, r: i32, c: Rgb) {
        for dy in -r..=r {
            for dx in -r..=r {
                let d = dx.abs() + dy.abs();
                if d <= r {
                    self.put(x + dx, y + dy, if d == r { BLACK } else { c });
                }
            }
        }
    }

    /// `text` with its top-left corner at `(x, y)`, each glyph `8·scale` pixels square;
    /// characters outside ASCII are drawn as `?`.
    pub fn text(&mut self, x: i32, y: i32, text: &str, c: Rgb, scale: i32) {
        for (i, ch) in text.chars().enumerate() {
            let glyph = BASIC_LEGACY[if ch.is_ascii() {
                ch as usize
            } else {
                '?' as usize
            }];
            let gx = x + i as i32 * GLYPH * scale;
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    // Bit 0 is the leftmost pixel.
                    if bits >> col & 1 == 1 {
                        self.fill_rect(gx + col * scale, y + row as i32 * scale, scale, scale, c);
                    }
                }
            }
        }
    }

    /// Width in pixels of `text` at `scale`.
    pub fn text_width(text: &str, scale: i32) -> i32 {
        text.chars().count() as i32 * GLYPH * scale
    }

    /// The image as PNG bytes (8-bit RGB).
    pub fn png(&self) -> Result<Vec<u8>, png::EncodingError> {
        let mut out = vec![];
        let mut enc = png::Encoder::new(&mut out, self.width, self.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&self.pixels)?;
        writer.finish()?;
        Ok(out)
    }
}
