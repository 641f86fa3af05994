//! Problem sizes small enough to run every library kernel in the interpreter quickly.

/// Parameters (as `key=value` text for [`quench_kernels::KernelSpec::parse_params`]) of
/// a small problem for library kernel `name`; empty for the kernel's defaults.
pub fn small_params(name: &str) -> &'static str {
    match name {
        n if n.starts_with("add_") || n.starts_with("silu_mul") => "n=1003 threads=64",
        n if n.starts_with("reduce_") || n.starts_with("softmax") => "rows=3 cols=324 threads=64",
        n if n.starts_with("rmsnorm") || n.starts_with("layernorm") => "rows=2 cols=576 threads=32",
        n if n.starts_with("gemv") => "rows=5 cols=576 warps=2 unroll=2",
        // k: a multiple of what every weight format's tiles need (512 for Q6_K).
        n if n.starts_with("gemm") => "m=32 n=128 k=512",
        n if n.starts_with("embed_") => "tokens=3 vocab=11 dim=288 threads=32",
        n if n.starts_with("rope_") => {
            "tokens=2 n_pos=9 head_dim=128 n_heads=5 n_kv_heads=1 threads=256"
        }
        n if n.starts_with("qgemv_q4_k") || n.starts_with("qgemv_q6_k") => {
            "rows=2 cols=768 warps=2 unroll=4"
        }
        n if n.starts_with("qgemv") => "rows=2 cols=1024 warps=1 unroll=2",
        n if n.starts_with("attention_decode") => {
            "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=16 split=64 threads=64"
        }
        n if n.starts_with("attention_merge") => "rows=6 head_dim=64 n_splits=5",
        n if n.starts_with("attention_prefill") => {
            "head_dim=64 n_heads=2 n_kv_heads=1 max_blocks=4 q_start=0 n_q=32"
        }
        n if n.starts_with("kv_append") => {
            "tokens=7 n_seqs=3 head_dim=64 n_kv_heads=2 max_blocks=2 threads=32"
        }
        n if n.starts_with("argmax") => "rows=3 cols=10000 threads=256",
        n if n.starts_with("sample_") => "rows=3 cols=4096 threads=256",
        _ => "",
    }
}
