//! A second, deliberately plain decoder forward for the tests: f64 scalar loops over a
//! Hugging Face layout checkpoint, sharing no code with quench-cpu, so that a mistake in the
//! library's forward does not hide by being made twice.

use quench_models::arch::{ModelConfig, TensorSource};

fn w(src: &dyn TensorSource, name: &str) -> Vec<f64> {
    src.get(name)
        .unwrap()
        .1
        .into_iter()
        .map(f64::from)
        .collect()
}

/// `m` is `[rows, x.len()]`.
fn matvec(m: &[f64], x: &[f64]) -> Vec<f64> {
    m.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], weight: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    x.iter()
        .zip(weight)
        .map(|(v, g)| v / (ms + eps).sqrt() * g)
        .collect()
}

/// Rotate-half RoPE of one head at position `pos`.
fn rope(head: &mut [f64], pos: usize, theta: f64) {
    let d = head.len();
    for i in 0..d / 2 {
        let angle = pos as f64 * theta.powf(-((2 * i) as f64) / d as f64);
        let (a, b) = (head[i], head[i + d / 2]);
        head[i] = a * angle.cos() - b * angle.sin();
        head[i + d / 2] = a * angle.sin() + b * angle.cos();
    }
}

/// Logits of every position, `[tokens][vocab]`.
pub fn naive_logits(c: &ModelConfig, src: &dyn TensorSource, tokens: &[u32]) -> Vec<Vec<f64>> {
    let hd = c.head_dim;
    let emb = w(src, "model.embed_tokens.weight");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| emb[t as usize * c.hidden..(t as usize + 1) * c.hidden].to_vec())
        .collect();
    for l in 0..c.layers {
        let p = format!("model.layers.{l}.");
        let get = |n: &str| w(src, &format!("{p}{n}"));
        let bias = |n: &str, len: usize| {
            if c.qkv_bias {
                get(n)
            } else {
                vec![0.0; len]
            }
        };
        let (qb, kb, vb) = (
            bias("self_attn.q_proj.bias", c.heads * hd),
            bias("self_attn.k_proj.bias", c.kv_heads * hd),
            bias("self_attn.v_proj.bias", c.kv_heads * hd),
        );
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (pos, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &get("input_layernorm.weight"), c.norm_eps);
            let add = |v: Vec<f64>, b: &[f64]| -> Vec<f64> {
                v.iter().zip(b).map(|(a, b)| a + b).collect()
            };
            let mut q = add(matvec(&get("self_attn.q_proj.weight"), &h), &qb);
            let mut k = add(matvec(&get("self_attn.k_proj.weight"), &h), &kb);
            let v = add(matvec(&get("self_attn.v_proj.weight"), &h), &vb);
            for (vec, norm) in [(&mut q, "q_norm"), (&mut k, "k_norm")] {
                for head in vec.chunks_mut(hd) {
                    if c.qk_norm {
                        let normed =
                            rms_norm(head, &get(&format!("self_attn.{norm}.weight")), c.norm_eps);
                        head.copy_from_slice(&normed);
                    }
                    rope(head, pos, c.rope_theta);
                }
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for t in 0..xs.len() {
            let mut attn = vec![0.0; c.heads * hd];
            for h in 0..c.heads {
                let kvh = h * c.kv_heads / c.heads;
                let q = &qs[t][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - max).exp() / total;
                    for i in 0..hd {
                        attn[h * hd + i] += p * vs[j][kvh * hd + i];
                    }
                }
            }
            let o = matvec(&get("self_attn.o_proj.weight"), &attn);
            xs[t].iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let h = rms_norm(&xs[t], &get("post_attention_layernorm.weight"), c.norm_eps);
            let gate = matvec(&get("mlp.gate_proj.weight"), &h);
            let up = matvec(&get("mlp.up_proj.weight"), &h);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = matvec(&get("mlp.down_proj.weight"), &act);
            xs[t].iter_mut().zip(&down).for_each(|(x, d)| *x += d);
        }
    }
    let out = if c.tied_embeddings {
        emb
    } else {
        w(src, "lm_head.weight")
    };
    let norm = w(src, "model.norm.weight");
    xs.iter()
        .map(|x| matvec(&out, &rms_norm(x, &norm, c.norm_eps)))
        .collect()
}
