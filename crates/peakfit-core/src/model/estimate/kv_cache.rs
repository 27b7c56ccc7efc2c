//! The attention KV cache of inference: per decoder layer, per kv head on this GPU, per token
//! of every sequence (beams included), and for encoder-decoders a self- and a cross-attention
//! cache per sequence. Encoders and diffusion pipelines keep none.
//!
//! | term | formula | source |
//! |---|---|---|
//! | KV cache | `/t` by kv heads (replicated below one per GPU), tokens `/c`; HF `generate` over tuple caches (no flash path stated, or Qwen v1's own code) holds two | vLLM `get_num_kv_heads`; ring attention; `QwenLM/Qwen` `README.md` (+1.04 MB per token against 0.52) |
//! | encoder-decoder cache | decoder layers (`L/2`) x per-sequence (self over the output + cross over every encoder position), sequences = batch x beams (CTranslate2: cross cache per input); faster-whisper batched (batch > 1): self cache over `n_text_ctx/2` output + 4 start tokens (no previous-text prompt) | HF `_expand_inputs_for_generation`; openai/whisper `n_audio_ctx` 1500, `n_text_ctx` 448, `sample_len = n_ctx // 2`, prompt `[-(n_ctx // 2 - 1):]` |
//! | encoder | no KV cache | — |

use super::Inputs;
use super::framework::Framework;
use crate::model::presets::Kind;

/// Whisper's start-of-transcript sequence: `<|startoftranscript|>`, language, task and
/// `<|notimestamps|>` (openai/whisper `sot_sequence_including_notimestamps`).
const WHISPER_SOT_TOKENS: f64 = 4.0;

impl Inputs {
    /// `2·L·kv_heads_per_gpu·head_dim·bytes·tokens`; kv heads are replicated, not split, when
    /// fewer than the tensor-parallel degree (vLLM `ModelConfig.get_num_kv_heads`:
    /// `max(1, total_kv_heads // tp)`).
    ///
    /// Encoders keep no cache. Encoder-decoders keep, per sequence (each beam is one: HF
    /// `_expand_inputs_for_generation` and openai/whisper repeat the encoder output per beam),
    /// the decoder's self-attention cache over its output and a cross-attention cache over
    /// every encoder position, in each of the decoder's `layers/2` layers.
    pub(super) fn kv_cache(&self, tokens: f64) -> f64 {
        let a = &self.arch;
        let kv_per_gpu = (f64::from(a.kv_heads) / self.tp).floor().max(1.0);
        let per_token_layer = 2.0 * kv_per_gpu * f64::from(a.head_dim) * self.kv_bytes;
        match self.kind {
            Kind::Encoder | Kind::Diffusion(_) => 0.0,
            Kind::EncoderDecoder {
                encoder_positions,
                decoder_positions,
            } => {
                let seqs = self.batch * self.beams;
                // CTranslate2 (faster-whisper) keeps one cross-attention cache per input, not
                // per beam: its batch-8 runs grew by one input's cache (0.22 GiB) per input,
                // in fp16 and int8 alike (faster-whisper v1.1.0 README). Inferred from those
                // two rows, not read in its source.
                let cross_seqs = if self.framework_is(Framework::is_ctranslate2) {
                    self.batch
                } else {
                    seqs
                };
                let pick = |n: u32| if n > 0 { f64::from(n) } else { self.context };
                // A decoder window of `n_text_ctx` holds at most half of it as prompt (the
                // previous segment's text, openai/whisper `prompt_tokens[-(n_ctx // 2 - 1):]`)
                // and half as output (`sample_len = n_ctx // 2`). faster-whisper's batched
                // pipeline decodes chunks in parallel, so no chunk is conditioned on another's
                // text: its sequences hold the start-of-transcript tokens and the output only.
                let decoder = if decoder_positions > 0
                    && self.batch > 1.0
                    && self.framework_is(Framework::is_ctranslate2)
                {
                    f64::from(decoder_positions / 2) + WHISPER_SOT_TOKENS
                } else {
                    pick(decoder_positions)
                };
                let decoder_layers = (f64::from(a.layers) / 2.0).max(1.0);
                decoder_layers
                    * per_token_layer
                    * (cross_seqs * pick(encoder_positions) + seqs * decoder)
            }
            Kind::Decoder => {
                // The legacy HF cache (tuples grown by `torch.cat`) measured ~2x the
                // theoretical KV (+1.04 MB per token against 0.52: `QwenLM/Qwen` `README.md`;
                // `RahulSChand/gpu_poor` `README.md`: 1 GB against 500 MB per 1000 tokens): the
                // step's new tuple is built while `generate` still holds the previous one. The
                // flash-attention / static-cache path of current models does not; Qwen v1's own
                // code keeps tuples on its flash path too (its README's FA2 rows sit one cache
                // below the 1x figure).
                let legacy = if self.legacy_cache { 2.0 } else { 1.0 };
                legacy * f64::from(a.layers) * per_token_layer * tokens * self.beams
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::estimate::testing::{est, est_with, part};

    #[test]
    fn kv_cache_counts_kv_heads_and_shards_by_tensor_parallel() {
        // Llama-3.1-8B: 32 layers x 8 kv heads x 128 x 2 (K,V) x 2 B = 128 KiB per token.
        let base = [
            ("model", "llama-3.1-8b"),
            ("context-tokens", "8192"),
            ("batch", "2"),
        ];
        let e = est(&base);
        assert_eq!(part(&e, "kv-cache"), 128.0 * 1024.0 * 8192.0 * 2.0);
        let tp = est_with(&base, &[("tensor-parallel", "2")]);
        assert_eq!(part(&tp, "kv-cache"), part(&e, "kv-cache") / 2.0);
        assert_eq!(tp.gpus, 2);
        assert!(part(&tp, "nccl") > 0.0 && part(&e, "nccl") == 0.0);
        // 8 kv heads over TP 16: replicated, one per GPU.
        let tp16 = est(&[("model", "llama-3.1-70b"), ("tensor-parallel", "16")]);
        let tp8 = est(&[("model", "llama-3.1-70b"), ("tensor-parallel", "8")]);
        assert_eq!(part(&tp16, "kv-cache"), part(&tp8, "kv-cache"));
        let fp8 = est_with(&base, &[("kv-dtype", "fp8")]);
        assert_eq!(part(&fp8, "kv-cache"), part(&e, "kv-cache") / 2.0);
    }

    #[test]
    fn batched_faster_whisper_holds_no_previous_text_in_its_decoder_cache() {
        let run = |engine: &'static str, batch: &'static str| {
            part(
                &est(&[
                    ("model", "whisper-large-v2"),
                    ("dtype", "fp16"),
                    ("engine", engine),
                    ("beams", "5"),
                    ("batch", batch),
                ]),
                "kv-cache",
            )
        };
        // 32 decoder layers x 2 x 20 heads x 64 x 2 B per token.
        let per_token = 32.0 * 2.0 * 20.0 * 64.0 * 2.0;
        // Sequential: cross over 1500 positions once per input, self over the whole 448-token
        // window per beam.
        assert_eq!(
            run("faster-whisper", "1"),
            per_token * (1500.0 + 5.0 * 448.0)
        );
        // Batched: 224 output + 4 start tokens per beam.
        assert_eq!(
            run("faster-whisper", "8"),
            per_token * 8.0 * (1500.0 + 5.0 * 228.0)
        );
        // openai/whisper conditions on previous text whatever the batch.
        assert_eq!(
            run("openai-whisper", "2"),
            per_token * 2.0 * 5.0 * (1500.0 + 448.0)
        );
    }

    #[test]
    fn qwen_v1_keeps_a_tuple_cache_on_its_flash_path() {
        let kv = |model: &'static str, flash: &'static str| {
            part(
                &est(&[
                    ("model", model),
                    ("engine", "hf"),
                    ("flash-attention", flash),
                    ("context-tokens", "2049"),
                ]),
                "kv-cache",
            )
        };
        // 32 layers x 2 x 32 kv heads x 128 x 2 B per token, both models.
        let one = 32.0 * 2.0 * 32.0 * 128.0 * 2.0 * 2049.0;
        assert_eq!(kv("llama-2-7b", "true"), one);
        // transformers' `DynamicCache` holds one copy, flash attention or not.
        assert_eq!(kv("llama-2-7b", "false"), one);
        assert_eq!(kv("qwen-7b-v1", "true"), 2.0 * one);
    }
}
