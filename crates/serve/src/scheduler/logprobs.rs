//! Log-probabilities of drawn tokens, as the model gives them (before temperature and
//! filtering), for the `logprobs` / `top_logprobs` request options.

/// A token id and its log-probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
}

/// The chosen token's log-probability and the `top` most likely tokens', most likely first
/// (equal ones by id).
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> (TokenLogprob, Vec<TokenLogprob>) {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f64::NEG_INFINITY, |m, v| m.max(v as f64));
    let log_total = max
        + logits
            .iter()
            .map(|&v| (v as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let logprob = |token: u32| TokenLogprob {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| (v as f64 - log_total) as f32),
    };
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let top = top.min(order.len());
    if top > 0 && top < order.len() {
        order.select_nth_unstable_by(top - 1, by_logit);
    }
    order.truncate(top);
    order.sort_by(by_logit);
    (logprob(chosen), order.into_iter().map(logprob).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn match_a_plain_log_softmax_and_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
        let logits: Vec<f32> = (0..50).map(|_| rng.gen_range(-8.0..8.0)).collect();
        let total: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        let want = |t: usize| ((logits[t] as f64).exp() / total).ln() as f32;
        let chosen = rng.gen_range(0..50u32);
        let (c, top) = logprobs(&logits, chosen, 5);
        assert!((c.logprob - want(chosen as usize)).abs() < 1e-5);
        let mut sorted: Vec<usize> = (0..50).collect();
        sorted.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        assert_eq!(top.len(), 5);
        for (got, &t) in top.iter().zip(&sorted) {
            assert_eq!(got.token, t as u32);
            assert!((got.logprob - want(t)).abs() < 1e-5);
        }
        let sum: f64 = (0..50).map(|t| (want(t) as f64).exp()).sum();
        assert!((sum - 1.0).abs() < 1e-5);
    }
}
