//! The decode step on a device of one multiprocessor, where every matrix–vector product
//! of a tiny model launches at most 8 blocks, fewer than its row groups, so that each
//! block loops over several: the graph caps exactly those grids, and on the kernel
//! interpreter the logits have the same bits as on the default grid — a prompt through
//! the prompt path (its LM head capped too), single steps, and steps of several rows
//! (the kernels that take several vectors a pass).
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

use quench_engine::gpu::{DecodeGraph, GpuDecoder, GpuOptions, Rows, StepShape};
use quench_engine::KvCache;
use quench_ir::Function;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::{GgmlType, GgufFile};
use quench_rt::{
    Arg, DevicePtr, EventId, Executor, GraphId, InterpExecutor, KernelAbi, KernelId, Launch,
    RtError, StreamId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{bits, gguf, seed, step_graph, Shape, Tiny, QUANTIZED};

const VOCAB: usize = 256;
const CHUNK: usize = 16;

/// The interpreter, reporting one multiprocessor: the engine caps its matrix–vector
/// products at 8 blocks.
struct OneMultiprocessor(InterpExecutor);

impl Executor for OneMultiprocessor {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn device_name(&self) -> String {
        self.0.device_name()
    }
    fn multiprocessors(&self) -> Option<u32> {
        Some(1)
    }
    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, RtError> {
        self.0.alloc(bytes)
    }
    fn free(&mut self, p: DevicePtr) -> Result<(), RtError> {
        self.0.free(p)
    }
    fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), RtError> {
        self.0.copy_to_device(dst, src)
    }
    fn copy_to_host(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RtError> {
        self.0.copy_to_host(src, dst)
    }
    fn copy_device_to_device(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> Result<(), RtError> {
        self.0.copy_device_to_device(dst, src, bytes)
    }
    fn load(&mut self, f: &Function) -> Result<KernelId, RtError> {
        self.0.load(f)
    }
    fn abi(&self, k: KernelId) -> Result<&KernelAbi, RtError> {
        self.0.abi(k)
    }
    fn launch(
        &mut self,
        k: KernelId,
        launch: &Launch,
        args: &[Arg],
        stream: StreamId,
    ) -> Result<(), RtError> {
        self.0.launch(k, launch, args, stream)
    }
    fn create_stream(&mut self) -> Result<StreamId, RtError> {
        self.0.create_stream()
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, RtError> {
        self.0.record_event(stream)
    }
    fn elapsed_ms(&mut self, start: EventId, end: EventId) -> Result<f32, RtError> {
        self.0.elapsed_ms(start, end)
    }
    fn release_event(&mut self, e: EventId) -> Result<(), RtError> {
        self.0.release_event(e)
    }
    fn begin_capture(&mut self, stream: StreamId) -> Result<(), RtError> {
        self.0.begin_capture(stream)
    }
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, RtError> {
        self.0.end_capture(stream)
    }
    fn replay(&mut self, g: GraphId, stream: StreamId) -> Result<(), RtError> {
        self.0.replay(g, stream)
    }
    fn release_graph(&mut self, g: GraphId) -> Result<(), RtError> {
        self.0.release_graph(g)
    }
    fn synchronize(&mut self) -> Result<(), RtError> {
        self.0.synchronize()
    }
}

/// One llama layer of width 128 (q|k|v in one Q8_0 product), ffn 256, 256 tokens and an
/// untied Q8_0 head: every matrix has more row groups than a multiprocessor's share of
/// its product's blocks.
fn model(rng: &mut ChaCha8Rng) -> GgufFile {
    let m = Tiny {
        arch: "llama",
        shape: Shape {
            hidden: 128,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            ffn: 256,
            vocab: VOCAB,
            context: 256,
            eps: 1e-5,
        },
        layers: vec![QUANTIZED],
        embedding: GgmlType::Q8_0,
        output: Some(GgmlType::Q8_0),
    };
    gguf(&m, rng)
}

fn decoder(file: &GgufFile, exec: Box<dyn Executor + Send>) -> GpuDecoder {
    let options = GpuOptions {
        context: Some(32),
        sessions: 2,
        max_batch: 2,
        prefill_chunk: CHUNK,
        prefill_min_tokens: 2,
        ..GpuOptions::default()
    };
    let config = ModelConfig::from_gguf(file).expect("a config");
    let d = GpuDecoder::new(config, file, Naming::Gguf, exec, None, &options).expect("loads");
    assert_eq!(d.summary().prefill_chunk, CHUNK, "the prompt path is on");
    d
}

#[test]
fn the_graph_caps_only_the_matrix_vector_grids() {
    let file = model(&mut ChaCha8Rng::seed_from_u64(seed()));
    let shape = StepShape {
        context: 32,
        sessions: 1,
        max_batch: 2,
        kv: KvCache::F16,
    };
    let (config, catalog, wide) = step_graph(&file, shape);
    let capped = DecodeGraph::assemble_for(&config, &catalog, &file, Naming::Gguf, shape, 1)
        .expect("a step");
    assert_eq!(wide.dispatches.len(), capped.dispatches.len());
    // Matrix–vector products of one-row steps and of steps of several rows.
    let mut gemvs = [0, 0];
    for (w, c) in wide.dispatches.iter().zip(&capped.dispatches) {
        assert_eq!((&w.label, w.rows), (&c.label, c.rows));
        let name = &capped.kernels[c.kernel].name;
        if name.contains("gemv") {
            gemvs[usize::from(c.rows == Rows::Many)] += 1;
            // 8 narrow blocks a multiprocessor: the integer formats' products take one
            // wide block only from 2048 columns (the engine's unit tests), and this
            // model's rows are 128 and 256 wide.
            let cap = c.launch_for(1).grid[0];
            assert_eq!(cap, 8, "{}: {cap} blocks", c.label);
            assert!(
                w.launch_for(1).grid[0] > cap,
                "{}: {} row groups",
                w.label,
                w.launch_for(1).grid[0]
            );
            assert_eq!(c.launch_for(1).grid, [cap, 1, 1], "{}", c.label);
        } else {
            assert_eq!(w.launch_for(1), c.launch_for(1), "{}", c.label);
        }
    }
    // q|k|v, o, gate|up, down and the LM head, in each kind of step.
    assert_eq!(gemvs, [5, 5]);
}

#[test]
fn capped_grids_give_the_same_logits() {
    let s = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let file = model(&mut rng);
    let default = decoder(&file, Box::new(InterpExecutor::new()));
    let capped = decoder(&file, Box::new(OneMultiprocessor(InterpExecutor::new())));
    let mut tokens =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..VOCAB as u32)).collect() };
    let (prompt, steps, other) = (tokens(6), tokens(3), tokens(3));

    let (mut a, mut b) = (default.new_session(), capped.new_session());
    let want = default.feed(&mut a, &prompt).expect("the prompt");
    let got = capped.feed(&mut b, &prompt).expect("the prompt");
    assert!(bits(&got) == bits(&want), "the prompt's last logits differ");
    for (i, &t) in steps.iter().enumerate() {
        let want = default.feed(&mut a, &[t]).expect("a step");
        let got = capped.feed(&mut b, &[t]).expect("a step");
        assert!(bits(&got) == bits(&want), "step {i}: the logits differ");
    }

    // Two rows a step: the kernels that take several vectors a pass.
    let (mut c, mut d) = (default.new_session(), capped.new_session());
    for (i, (&t, &u)) in steps.iter().zip(&other).enumerate() {
        let want = default
            .step_batch(&mut [(&mut a, t), (&mut c, u)])
            .expect("a step");
        let got = capped
            .step_batch(&mut [(&mut b, t), (&mut d, u)])
            .expect("a step");
        for (row, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                bits(g) == bits(w),
                "batched step {i}, row {row}: the logits differ"
            );
        }
    }
}
