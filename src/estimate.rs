//! `peakfit estimate`: the scheduler's own prediction for a pod, from the same annotations it
//! reads, so an ML engineer can check a pod before submitting it. It reads files and prints; it
//! may not touch a cluster (the arithmetic is `peakfit-core`'s).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::cluster::profile::GpuWorkloadProfile;
use crate::cluster::profile::store::{display_name, history_of};
use crate::learn::{LearnMode, LearnPolicy, size_pod};
use crate::model::annotations::{PREFIX, Spec, request_on};
use crate::model::estimate::{Counter, Platform, estimate_on};
use crate::model::quantity::{GIB, parse_bytes};
use crate::placement::GpuRoom;

#[derive(Clone, Debug, clap::Args)]
pub struct EstimateArgs {
    /// An annotation, `KEY=VALUE`; the `peakfit.io/` prefix is optional. Repeatable, or several
    /// separated by commas (no annotation value contains one), which is how the env var lists them.
    #[arg(
        short = 'a',
        long = "annotation",
        value_name = "KEY=VALUE",
        env = "PEAKFIT_ANNOTATIONS",
        value_delimiter = ','
    )]
    pub annotations: Vec<String>,
    /// A Pod manifest (YAML or JSON) whose annotations to read; `-a` values override them.
    #[arg(long, value_name = "FILE", env = "PEAKFIT_POD")]
    pub pod: Option<PathBuf>,
    /// The model's Hugging Face `config.json`: its layers, widths, heads, vocabulary, FFN,
    /// tied embeddings, dtype / quantisation, experts and vision tower become the shape
    /// annotations (and a derived `params`); the pod's and `-a` values override them. In a
    /// cluster the same file goes in a ConfigMap (key `config.json`, label
    /// `peakfit.io/model-config: "true"`) named by the pod's `peakfit.io/model-config`.
    #[arg(long, value_name = "FILE", env = "PEAKFIT_MODEL_CONFIG")]
    pub model_config: Option<PathBuf>,
    /// Memory of the GPU the pod would run on. Engines that budget a fraction of the GPU (vLLM,
    /// SGLang, TGI, TensorRT-LLM) need it; default 80Gi (A100/H100 80 GB).
    #[arg(
        long,
        value_name = "QUANTITY",
        env = "PEAKFIT_GPU_MEMORY",
        default_value = "80Gi"
    )]
    pub gpu_memory: String,
    /// NVML's memory for a process right after its first CUDA call on the target nodes' driver
    /// and CUDA (the default, 0.598 GiB, was measured on an H200 with driver 580 and CUDA 13;
    /// older stacks differ: measure with `nvidia-smi` after `torch.zeros(1, device="cuda")`).
    #[arg(long, value_name = "QUANTITY", env = "PEAKFIT_CUDA_CONTEXT")]
    pub cuda_context: Option<String>,
    /// The pod's `GpuWorkloadProfile` (YAML or JSON, as `kubectl get gwp NAME -o yaml` prints
    /// it): `estimate` then also says the size the extender would place the pod at, from what
    /// its workload's pods were seen to use, and why (issue 21).
    #[arg(long, value_name = "FILE", env = "PEAKFIT_PROFILE")]
    pub profile: Option<PathBuf>,
    /// With `--profile`: the extender's `--learn` (`off`, `predicted`, `all`). The margin and the
    /// trusted runtime are the extender's defaults.
    #[arg(long, env = "PEAKFIT_LEARN", default_value = "predicted", value_parser = parse_learn_mode)]
    pub learn: LearnMode,
    /// Print JSON instead of a table.
    #[arg(long, env = "PEAKFIT_JSON")]
    pub json: bool,
}

fn parse_learn_mode(s: &str) -> Result<LearnMode, String> {
    s.parse()
}

/// A `GpuWorkloadProfile` file: a profile is kilobytes (at most 100 pods listed).
const MAX_PROFILE_FILE_BYTES: u64 = MAX_POD_FILE_BYTES;

fn read_profile(path: &PathBuf) -> anyhow::Result<GpuWorkloadProfile> {
    let text = read_small_file(
        path,
        MAX_PROFILE_FILE_BYTES,
        "--profile",
        "the most the API server accepts; a profile is kilobytes",
    )?;
    let profile: GpuWorkloadProfile = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON GpuWorkloadProfile", path.display()))?
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("{} is not a YAML GpuWorkloadProfile", path.display()))?
    };
    Ok(profile)
}

/// The extender's sizing of this request from `profile`, as it would place the pod: `None` for
/// a pod the profile cannot size (an engine that takes a fraction of the GPU), or a profile
/// without a status.
fn sized_from_profile(
    profile: &GpuWorkloadProfile,
    req: &crate::model::PodRequest,
    explicit: bool,
    mode: LearnMode,
) -> Option<(u64, String)> {
    if req.demand.gpu_fraction > 0.0 {
        return None;
    }
    let status = profile.status.as_ref()?;
    let policy = LearnPolicy {
        mode,
        ..LearnPolicy::default()
    };
    let history = history_of(status, policy.min_runtime_secs);
    let predicted = req.demand.fixed_bytes;
    let sized = size_pod(predicted, explicit, Some(&history), &policy);
    let why = sized.describe(predicted, &display_name(&profile.key()));
    Some((sized.bytes, why))
}

/// The platform `--cuda-context` describes (the measured default without it).
fn platform(args: &EstimateArgs) -> anyhow::Result<Platform> {
    let Some(text) = &args.cuda_context else {
        return Ok(Platform::default());
    };
    let bytes = parse_bytes(text).map_err(|e| anyhow::anyhow!("--cuda-context {text:?}: {e}"))?;
    // No CUDA context comes near 16 GiB; a larger value is a unit mistake (16G for 16M).
    if bytes > 16 << 30 {
        bail!("--cuda-context {text:?}: at most 16Gi (a CUDA context is about 0.3-1 GiB)");
    }
    Ok(Platform {
        cuda_context: bytes,
    })
}

/// The largest `--pod` file read: the API server's own limit on a request (etcd's 1.5 MiB). A
/// Pod manifest is kilobytes; without a cap `--pod /dev/zero` grew until memory ran out.
pub const MAX_POD_FILE_BYTES: u64 = 1536 << 10;

/// A small input file read whole: refused unless a regular file (a FIFO would block the open, a
/// device such as `/dev/zero` never ends), and refused past `max` bytes without reading more
/// (`--model-config /dev/zero` grew until memory ran out, issue 24). `what` names the flag.
fn read_small_file(path: &PathBuf, max: u64, what: &str, why: &str) -> anyhow::Result<String> {
    use std::io::Read as _;
    let meta =
        std::fs::metadata(path).with_context(|| format!("reading {what} {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{what} {}: not a regular file ({:?}); give the path of a file",
            path.display(),
            meta.file_type()
        );
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .with_context(|| format!("reading {what} {}", path.display()))?;
    if text.len() as u64 > max {
        bail!(
            "{what} {}: larger than {} KiB, the most read ({why})",
            path.display(),
            max >> 10
        );
    }
    Ok(text)
}

fn pod_annotations(path: &PathBuf) -> anyhow::Result<BTreeMap<String, String>> {
    let text = read_small_file(
        path,
        MAX_POD_FILE_BYTES,
        "--pod",
        "the most the API server accepts; a Pod manifest is kilobytes",
    )?;
    let pod: Pod = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON Pod", path.display()))?
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("{} is not a YAML Pod", path.display()))?
    };
    Ok(pod.metadata.annotations.unwrap_or_default())
}

/// The largest `config.json` read: real ones are a few KiB; a multi-megabyte file is a
/// wrong path (a weights shard), not a config.
const MAX_MODEL_CONFIG: u64 = 1 << 20;

/// The annotations a `config.json` implies, prefixed, and its notes for the reader.
fn model_config(path: &PathBuf) -> anyhow::Result<(BTreeMap<String, String>, Vec<String>)> {
    let text = read_small_file(
        path,
        MAX_MODEL_CONFIG,
        "--model-config",
        "a config.json is a few KiB",
    )?;
    let parsed = crate::model::hf_config::annotations(&text)
        .with_context(|| format!("--model-config {}", path.display()))?;
    let annotations = parsed
        .annotations
        .into_iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v))
        .collect();
    Ok((annotations, parsed.notes))
}

/// All annotations, prefixed: the config's first, then the pod's, then `-a` values over them.
fn collect(args: &EstimateArgs) -> anyhow::Result<BTreeMap<String, String>> {
    let mut annotations = match &args.model_config {
        Some(path) => model_config(path)?.0,
        None => BTreeMap::new(),
    };
    if let Some(path) = &args.pod {
        annotations.extend(pod_annotations(path)?);
    }
    for pair in &args.annotations {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("-a {pair:?}: expected KEY=VALUE, e.g. -a model=llama-3.1-8b");
        };
        let key = key.trim();
        let key = key.strip_prefix(PREFIX).unwrap_or(key);
        annotations.insert(format!("{PREFIX}{key}"), value.to_string());
    }
    Ok(annotations)
}

/// The workload kind and the error band measured for it (see `peakfit_core::model::confidence`).
fn confidence(spec: &Spec) -> serde_json::Value {
    let kind = crate::model::confidence::workload_kind(spec);
    match crate::model::confidence::band_for(spec) {
        Some(b) => json!({
            "kind": kind,
            "class": crate::model::confidence::class(b),
            "rows": b.rows,
            "median": b.median,
            "p90": b.p90,
            "signed_median": b.signed_median,
        }),
        None => json!({ "kind": kind, "class": "unmeasured" }),
    }
}

pub fn run(args: &EstimateArgs) -> anyhow::Result<()> {
    let gpu_total = parse_bytes(&args.gpu_memory)
        .map_err(|e| anyhow::anyhow!("--gpu-memory {:?}: {e}", args.gpu_memory))?;
    if gpu_total == 0 {
        bail!("--gpu-memory {:?}: must be above zero", args.gpu_memory);
    }
    let annotations = collect(args)?;
    let spec = Spec::parse(&annotations)?;
    if spec.is_empty() {
        bail!(
            "no peakfit.io input annotation given: pass -a KEY=VALUE (e.g. -a model=llama-3.1-8b) \
             or --pod FILE with peakfit.io/* annotations"
        );
    }
    let platform = platform(args)?;
    let req = request_on(&spec, platform)?;
    // The model's breakdown at this GPU size; with an explicit `vram` it is still shown, for
    // comparison, when a model is described.
    let described = spec.vram.is_none() || spec.model.is_some() || spec.params.is_some();
    let model = described.then(|| estimate_on(&spec, gpu_total, platform));
    let runs = req.demand.runs_on(gpu_total);
    // Where the pod cannot run, its own peak, not the GPU it does not fit.
    let per_gpu = if runs || !req.demand.fills_gpu {
        req.demand.bytes_on(gpu_total)
    } else {
        req.demand.fixed_bytes
    };
    // The cached peak outgrows this GPU, and the pod runs there anyway, filling it (the
    // extender's rule, without a driver reserve or margin, which the estimate does not know).
    // So it reads a GPU only by its size: the extender keeps its safety margin (256 MiB by
    // default) on top, so a peak or a floor within that margin of `--gpu-memory` is taken whole
    // or refused there where this says it shares or runs (`Demand::whole_on`, `runs_in`).
    let fills = req.demand.fills_gpu && req.demand.whole_on(GpuRoom::bare(gpu_total));
    let learned = match &args.profile {
        Some(path) => {
            let profile = read_profile(path)?;
            Some(sized_from_profile(
                &profile,
                &req,
                spec.vram.is_some(),
                args.learn,
            ))
        }
        None => None,
    };
    if args.json {
        let mut components: serde_json::Map<String, serde_json::Value> = model
            .iter()
            .flat_map(|e| e.components.iter())
            .map(|c| (c.name.to_string(), json!(c.bytes)))
            .collect();
        if model.is_none() {
            components.insert("explicit-vram".into(), json!(per_gpu));
        }
        let out = json!({
            "per_gpu_bytes": per_gpu,
            "allocated_bytes": model.as_ref().map(|e| e.allocated_bytes),
            "reserved_bytes": model.as_ref().map(|e| e.reserved_bytes),
            "gpus": req.gpus,
            "components": components,
            "counters": model.as_ref().map(|e| e.components.iter()
                .map(|c| (c.name.to_string(), json!(c.counter)))
                .collect::<serde_json::Map<_, _>>()),
            "demand": req.demand,
            "engine_fraction": req.engine_fraction,
            "engine_budget_bytes": model.as_ref().and_then(|e| e.engine_budget_bytes),
            "gpu_memory_bytes": gpu_total,
            "runs_on_gpu": runs,
            "fills_gpu": fills,
            "explicit_vram": spec.vram,
            "assumed": model.as_ref().map(|e| e.assumed.clone()).unwrap_or_default(),
            "confidence": model.as_ref().map(|_| confidence(&spec)),
            "profile_sized_bytes": learned.as_ref().and_then(|l| l.as_ref().map(|(b, _)| *b)),
            "profile_sizing": learned.as_ref().map(|l| l.as_ref().map_or(
                "not sized from the profile: the engine takes a fraction of the GPU, or the \
                 profile has no status",
                |(_, why)| why.as_str(),
            )),
        });
        return Ok(crate::stdout::emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&out)?
        ))?);
    }
    let gib = |b: u64| format!("{:>9.2} GiB", b as f64 / GIB);
    let mut text = String::new();
    writeln!(text, "GPU memory: {} (--gpu-memory)", gib(gpu_total).trim())?;
    if let Some(e) = &model {
        writeln!(
            text,
            "{:<20} {:<10} {:>13}",
            "component", "counter", "per GPU"
        )?;
        for c in &e.components {
            let counter = match c.counter {
                Counter::Allocated => "allocated",
                Counter::Reserved => "reserved",
                Counter::Process => "process",
            };
            writeln!(text, "{:<20} {:<10} {}", c.name, counter, gib(c.bytes))?;
        }
        writeln!(
            text,
            "{:<31} {}",
            "allocated (max_allocated)",
            gib(e.allocated_bytes)
        )?;
        writeln!(
            text,
            "{:<31} {}",
            "reserved (max_reserved)",
            gib(e.reserved_bytes)
        )?;
        if let Some(budget) = e.engine_budget_bytes {
            writeln!(text, "{:<31} {}", "engine budget", gib(budget))?;
        }
        for a in &e.assumed {
            writeln!(text, "assumed: {a}")?;
        }
        let c = confidence(&spec);
        match c["rows"].as_u64() {
            Some(rows) => writeln!(
                text,
                "confidence: {} ({} workloads: median |error| {}%, p90 {}%, signed median {}% \
                 over {rows} real-GPU measurements)",
                c["class"].as_str().unwrap_or_default(),
                c["kind"].as_str().unwrap_or_default(),
                c["median"],
                c["p90"],
                c["signed_median"]
            )?,
            None => writeln!(
                text,
                "confidence: unmeasured ({} workloads: no public measurement; consider \
                 {PREFIX}vram)",
                c["kind"].as_str().unwrap_or_default()
            )?,
        }
        if let Some(path) = &args.model_config {
            for note in model_config(path)?.1 {
                writeln!(text, "from {}: {note}", path.display())?;
            }
        }
    }
    if let Some(vram) = spec.vram {
        writeln!(
            text,
            "explicit {PREFIX}vram {} overrides the model",
            gib(vram).trim()
        )?;
    }
    writeln!(text, "{:<31} {}", "per GPU (NVML)", gib(per_gpu))?;
    writeln!(text, "{:<31} {:>13}", "GPUs", req.gpus)?;
    if let Some(f) = req.engine_fraction {
        writeln!(text, "{:<31} {:>13}", "engine fraction", format!("{f:.4}"))?;
    }
    if fills {
        writeln!(
            text,
            "whole GPU: with its allocator's cache the pod would peak at {}, more than a {} \
             GPU; PyTorch frees the cache and retries a failed cudaMalloc, so the pod runs \
             there filling the GPU (without the cache it needs {}), and peakfit places it alone \
             on one",
            gib(req.demand.fixed_bytes).trim(),
            gib(gpu_total).trim(),
            gib(req.demand.min_gpu_total_bytes).trim()
        )?;
    }
    if !runs {
        writeln!(
            text,
            "does not fit a {} GPU: needs at least {}",
            gib(gpu_total).trim(),
            gib(req.demand.min_gpu_total_bytes).trim()
        )?;
    }
    match &learned {
        Some(Some((bytes, why))) => {
            writeln!(text, "{:<31} {}", "per GPU (from the profile)", gib(*bytes))?;
            writeln!(text, "profile: {why}")?;
        }
        Some(None) => writeln!(
            text,
            "profile: not used (the engine takes a fraction of the GPU, or the profile has no \
             status)"
        )?,
        None => {}
    }
    Ok(crate::stdout::emit(&text)?)
}
