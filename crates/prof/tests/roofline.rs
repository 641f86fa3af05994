//! The roofline PNG decodes, has the planned size, and shows each kernel's colour where
//! it has something to show.

use quench_prof::roofline::roofline_png;
use quench_prof::{summarize, Ceilings, Dispatch};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn decode(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(png_bytes);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("one frame");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn has(pixels: &[u8], c: [u8; 3]) -> bool {
    pixels.chunks_exact(3).any(|p| p == c)
}

#[test]
fn figure_shows_kernels_and_ceilings() {
    let seed = quench_testkit::seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let d = |kernel: &str, bytes: u64, flops: u64, dur: u64| Dispatch {
        kernel: kernel.into(),
        start_ns: 1_000,
        end_ns: 1_000 + dur,
        bytes,
        flops,
        ..Dispatch::default()
    };
    // First kernel (blue): bytes and FLOPs; second (orange): bytes only; third (green):
    // nothing modeled.
    let ds = [
        d(
            "gemv",
            rng.gen_range(1_000_000..4_000_000),
            rng.gen_range(500_000..2_000_000),
            3_000,
        ),
        d("argmax", rng.gen_range(10_000..40_000), 0, 2_000),
        d("rope", 0, 0, 1_000),
    ];
    let s = summarize(&ds);
    let ceilings = Ceilings {
        copy_bytes_per_s: Some(4e12),
        flops: Some(60e12),
    };
    let (w, h, px) = decode(&roofline_png(&s, &ceilings, "test").expect("drawn"));
    assert_eq!((w, h), (1200, 640));
    let (blue, orange, green, red) = ([31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40]);
    assert!(has(&px, blue) && has(&px, orange) && has(&px, red));
    assert!(
        !has(&px, green),
        "a kernel with nothing modeled is not drawn"
    );

    // Without ceilings: no roofs (red is only the compute roof here).
    let (_, _, px) = decode(&roofline_png(&s, &Ceilings::default(), "no ceilings").expect("drawn"));
    assert!(has(&px, blue) && has(&px, orange) && !has(&px, red));
}
