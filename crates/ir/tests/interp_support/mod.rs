//! Helpers shared by the interpreter tests: device buffers, launch shapes, seeded
//! random numbers.
#![allow(dead_code)] // each test file uses a different subset

use quench_ir::interp::{Device, LaunchConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A fresh random generator; the seed is printed so a failure can be replayed.
pub fn rng() -> ChaCha8Rng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

/// Bytes every output buffer is filled with before a launch.
pub const POISON: u8 = 0xa5;

pub fn upload(dev: &mut Device, bytes: &[u8]) -> u64 {
    let addr = dev.mem.alloc(bytes.len() as u64).expect("alloc");
    dev.mem.write(addr, bytes).expect("write");
    addr
}

/// An output buffer of `bytes` bytes, poisoned.
pub fn output(dev: &mut Device, bytes: usize) -> u64 {
    upload(dev, &vec![POISON; bytes])
}

pub fn download(dev: &Device, addr: u64, bytes: usize) -> Vec<u8> {
    let mut out = vec![0; bytes];
    dev.mem.read(addr, &mut out).expect("read");
    out
}

pub fn upload_u32(dev: &mut Device, v: &[u32]) -> u64 {
    upload(
        dev,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
}

pub fn upload_u64(dev: &mut Device, v: &[u64]) -> u64 {
    upload(
        dev,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
}

pub fn upload_u16(dev: &mut Device, v: &[u16]) -> u64 {
    upload(
        dev,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
}

pub fn download_u32(dev: &Device, addr: u64, n: usize) -> Vec<u32> {
    download(dev, addr, 4 * n)
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn download_u64(dev: &Device, addr: u64, n: usize) -> Vec<u64> {
    download(dev, addr, 8 * n)
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

pub fn download_u16(dev: &Device, addr: u64, n: usize) -> Vec<u16> {
    download(dev, addr, 2 * n)
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

pub const POISON_U32: u32 = u32::from_le_bytes([POISON; 4]);
