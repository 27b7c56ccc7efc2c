//! Latent-diffusion pipelines (Stable Diffusion 1.5, SDXL, SD3, FLUX): the peak is the largest of
//! three phases, each with the weights resident during it and that phase's activations.
//!
//! | term | formula | source |
//! |---|---|---|
//! | diffusion | largest of text encoding, denoising (`UNET_ACT_PER_TOKEN` or a DiT block `34·tokens·samples·hidden`) and VAE decode (`VAE_PER_PIXEL`) over the weights resident in that phase | fitted constants, see each |

use super::Inputs;
use super::activations::ACT_NONE;
use crate::model::annotations::{Dtype, Offload, Spec, VaeDecode};
use crate::model::presets::Diffusion;
use crate::model::quantity::GIB;

/// Denoiser activations at inference per latent token per sample in the batch, 16-bit, for a
/// UNet (SD 1.5, SDXL): its ResNet and attention blocks at several resolutions hold far more
/// than one transformer layer. Fitted on the SDXL rows whose peak is the UNet, not the VAE
/// (`default + VAE slicing` 15.40 GiB and `default + Tiny Autoencoder` 15.48 GiB, 8 UNet
/// samples of 128x128 latents: huggingface/blog `simple_sdxl_optimizations.md`): 8.9 GiB over
/// 131072 sample-tokens.
pub const UNET_ACT_PER_TOKEN: f64 = 72.0 * 1024.0;
/// The VAE decoder's peak per output pixel of one image: its 128-512-channel convolutions at
/// full resolution, in fp32 or fp16 alike (the `GroupNorms` upcast). Fitted on two sources:
/// SDXL's fp32-upcast VAE, 4 images at 1024² = 15.2 GiB over the weights (the blog's
/// `fp16` 21.72 GiB against `VAE slicing`), and SD3's fp16 VAE, one 1024² image, ~3.2 GiB
/// over the weights (huggingface/blog `sd3.md` default 18.77 GB); 3.5 GiB per megapixel.
pub const VAE_PER_PIXEL: f64 = 3.5 * GIB / 1_048_576.0;
/// What stays on the GPU under layer streaming (`sequential` offload): the submodule running
/// and the one being fetched, taken as 5 % of the largest component (a UNet or DiT block,
/// the T5 encoder's largest layer). An assumption, not fitted.
pub const SEQUENTIAL_RESIDENT: f64 = 0.05;

/// A latent-diffusion pipeline's peak: the largest of its three phases (text encoding,
/// denoising, VAE decode), each with the weights resident during it and its activations.
///
/// - denoiser batch = prompts x images x (2 with classifier-free guidance: diffusers
///   concatenates the unconditional and conditional latents);
/// - latent tokens = (image / pixels-per-token)²; a DiT holds one block's working set,
///   `34·tokens·batch·hidden` (Korthikanti's per-layer bytes, nothing saved at inference); a
///   UNet [`UNET_ACT_PER_TOKEN`];
/// - VAE decode = [`VAE_PER_PIXEL`] x pixels x images decoded at once: slicing decodes one
///   image at a time, tiling one tile of the VAE's native size (diffusers
///   `tile_sample_min_size`);
/// - offload `model` keeps only the running component, `sequential` (and `params`)
///   [`SEQUENTIAL_RESIDENT`] of it.
pub(super) fn diffusion_peak(
    spec: &Spec,
    inp: &Inputs,
    d: &Diffusion,
    assumed: &mut Vec<String>,
) -> Vec<(&'static str, f64)> {
    let bytes = inp.weight_bits() / 8.0;
    let act_bytes = if inp.dtype == Dtype::Fp32 { 2.0 } else { 1.0 };
    let image = f64::from(spec.image_size.unwrap_or_else(|| {
        assumed.push(format!("image-size {}", d.default_image));
        d.default_image
    }));
    let images = f64::from(spec.images.unwrap_or(1)) * inp.batch;
    let guidance = spec.guidance.unwrap_or(d.guidance);
    let samples = images * if guidance { 2.0 } else { 1.0 };
    let tokens = (image / f64::from(d.pixels_per_token)).powi(2);
    let denoiser_act = if d.dit_hidden > 0 {
        ACT_NONE * tokens * samples * f64::from(d.dit_hidden) * act_bytes
    } else {
        UNET_ACT_PER_TOKEN * tokens * samples * act_bytes
    };
    let vae = spec.vae_decode.unwrap_or(VaeDecode::Full);
    let pixels = if vae.tiling() {
        image.min(f64::from(d.default_image)).powi(2)
    } else {
        image * image
    };
    let decoded = if vae.slicing() { 1.0 } else { images };
    let vae_act = VAE_PER_PIXEL * pixels * decoded;
    let vae_bytes = if d.vae_upcast { 4.0 } else { bytes };
    let text = d.text_encoder_params as f64 * bytes;
    let denoiser = d.denoiser_params as f64 * bytes;
    let vae_w = d.vae_params as f64 * vae_bytes;
    let all = text + denoiser + vae_w;
    let resident = |component: f64| match inp.offload {
        Offload::Model => component,
        Offload::Sequential | Offload::Params | Offload::OptimizerParams => {
            SEQUENTIAL_RESIDENT * component
        }
        _ => all,
    };
    let largest_text = d.largest_text_encoder_params as f64 * bytes;
    // Model offload: the component that ran last is still on the GPU when the next one starts
    // (SDXL's offloaded peak 20.21 GiB = UNet + VAE + decode, SD3's 12.06 = T5-XXL + DiT,
    // huggingface/blog simple_sdxl_optimizations.md and sd3.md); the hook order behind it is
    // not verified in accelerate's source.
    let before = |previous: f64| {
        if inp.offload == Offload::Model {
            previous
        } else {
            0.0
        }
    };
    let phases = [
        (resident(largest_text), "text-encoders", 0.0),
        (
            resident(denoiser) + before(largest_text),
            "denoiser-activations",
            denoiser_act,
        ),
        (resident(vae_w) + before(denoiser), "vae-decode", vae_act),
    ];
    let (w, name, act) = phases
        .into_iter()
        .max_by(|a, b| (a.0 + a.2).total_cmp(&(b.0 + b.2)))
        .unwrap_or((all, "vae-decode", 0.0));
    vec![("weights", w), (name, act)]
}
