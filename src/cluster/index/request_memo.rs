//! A bounded memo of pod requests, keyed by exactly what the peak-memory model reads.
//!
//! filter, prioritize and preempt work out the request of the pod kube-scheduler sends them on
//! every call (`Index::request_of`), and the pod watch on every event of every pod. For a
//! decoder of Llama's code the model replays the prefill through the caching allocator
//! (`peakfit_core::model::estimate::prefill_replay`), 0.5-1.2 ms a call (`cargo bench --bench
//! estimate`), and a pending pod is asked about again on every retry, once per verb. The same
//! inputs always give the same request, so the result is kept.
//!
//! The key is the model's whole input: the pod's `peakfit.io/` annotations after its
//! `peakfit.io/model-config` ConfigMap was merged under them, less those the parser steps over
//! ([`model::annotations::is_model_input`]: bind's outputs, the hold, the workload's name), and
//! the platform (`--cuda-context`). `model::annotations::pod_request_on` is a pure function of
//! these, so a hit is what a fresh run would return: an edited annotation or a changed
//! ConfigMap is another key, never a stale answer. Errors are kept too, with their message, so
//! a pod with a bad annotation is refused as fast as it was the second time.
//!
//! Bound: [`CAPACITY`] entries in two generations (a cheap approximation of least recently
//! used, as in a two-queue cache): new results go into the current generation; when it holds
//! half the capacity it becomes the previous one and the old previous one is dropped; a hit in
//! the previous generation moves the entry back into the current one. A key used at least once
//! every `CAPACITY / 2` new keys is never dropped, and neither generation ever grows beyond
//! half. A key whose inputs exceed [`MAX_INPUT_BYTES`] (no real pod's do) is worked out every
//! time and not kept, so the memo's memory is bounded whatever pods say.
//!
//! Concurrency: one mutex, held to look a key up or store a result, never across the model: a
//! miss runs the model unlocked, so filter, prioritize and the watch never wait on another
//! caller's model run. Two callers missing the same key at once both run it and store the same
//! result.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;

use crate::model::estimate::Platform;
use crate::model::{self, AnnotationError, PodRequest};

/// What the model answers for a pod: `Ok(None)` for a pod without inputs.
pub(super) type Outcome = Result<Option<PodRequest>, AnnotationError>;

/// Entries kept at most, over both generations. A cluster's pods come in few shapes (the
/// replicas of a Deployment or a Job share their annotations, and bind's outputs are not part of
/// the key), and what must stay is the pending pods' shapes, which the scheduler asks about
/// again: thousands cover every shape of a large cluster. At the [`MAX_INPUT_BYTES`] cap an entry
/// is under 6 KiB (its inputs, the result and an error's clipped message), so the memo holds
/// under 24 MiB at worst; an entry of 20 short annotations takes about 1.5 KiB.
pub const CAPACITY: usize = 4096;

/// What a kept pair costs beyond its text: two boxed `str`s (16 B each) and their two heap
/// blocks (at least 16 B each, rounded up by the allocator). Counting it keeps a pod of hundreds
/// of empty `peakfit.io/…` keys from holding several times [`MAX_INPUT_BYTES`] per entry.
const PAIR_OVERHEAD: usize = 64;

/// The largest key kept, in bytes of annotation keys and values plus [`PAIR_OVERHEAD`] a pair
/// (so at most 64 pairs). A pod's usual ten to twenty inputs take 1–2.5 KiB counted so; a pod
/// over this is worked out on each call rather than let a few pods of 256 KiB annotations, or
/// of hundreds of keys, fill memory.
pub const MAX_INPUT_BYTES: usize = 4096;

/// A kept result and the inputs it is for (compared in full on a hit: the map is keyed by
/// their hash).
struct Entry {
    inputs: Box<[(Box<str>, Box<str>)]>,
    platform: Platform,
    outcome: Outcome,
}

impl Entry {
    fn is_for(&self, inputs: &[(&str, &str)], platform: Platform) -> bool {
        self.platform == platform
            && self.inputs.len() == inputs.len()
            && self
                .inputs
                .iter()
                .zip(inputs)
                .all(|((k, v), (k2, v2))| **k == **k2 && **v == **v2)
    }
}

type Generation = HashMap<u64, Entry, foldhash::fast::RandomState>;

#[derive(Default)]
struct Generations {
    current: Generation,
    previous: Generation,
}

impl Generations {
    /// Stores `entry` under `hash` in the current generation, first retiring it if full.
    fn insert(&mut self, hash: u64, entry: Entry, half: usize) {
        if self.current.len() >= half && !self.current.contains_key(&hash) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(hash, entry);
    }

    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

/// The memo (see the module documentation). Its counters are exported as
/// `peakfit_request_memo_{hits,misses}_total` (`metrics::extender::ExtenderMetrics::with_index`).
pub struct RequestMemo {
    generations: Mutex<Generations>,
    /// Seeded per process: a pod's author cannot choose annotations that collide with another
    /// pod's (a collision would only cost a miss: entries are compared in full).
    hasher: foldhash::fast::RandomState,
    /// Half the capacity: the most one generation holds.
    half: usize,
    hits: Counter,
    misses: Counter,
}

impl Default for RequestMemo {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl RequestMemo {
    /// A memo of at most `capacity` entries (at least 2: one per generation).
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            generations: Mutex::default(),
            hasher: foldhash::fast::RandomState::default(),
            half: (capacity / 2).max(1),
            hits: Counter::default(),
            misses: Counter::default(),
        }
    }

    /// The request for `annotations` (already merged with the pod's ConfigMap) on `platform`:
    /// the kept one, or `compute`'s, then kept. `compute` must be the model on these annotations
    /// and this platform. A pod without model inputs (most pods of a cluster) is passed to
    /// `compute` without touching the memo: the parser answers `Ok(None)` for it at once.
    pub(super) fn get_or_compute(
        &self,
        annotations: &BTreeMap<String, String>,
        platform: Platform,
        compute: impl FnOnce() -> Outcome,
    ) -> Outcome {
        let inputs: Vec<(&str, &str)> = annotations
            .iter()
            .filter(|(k, _)| model::annotations::is_model_input(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if inputs.is_empty() {
            return compute();
        }
        let bytes: usize = inputs
            .iter()
            .map(|(k, v)| k.len() + v.len() + PAIR_OVERHEAD)
            .sum();
        if bytes > MAX_INPUT_BYTES {
            self.misses.inc();
            return compute();
        }
        let hash = self.hash(&inputs, platform);
        if let Some(outcome) = self.lookup(hash, &inputs, platform) {
            self.hits.inc();
            return outcome;
        }
        self.misses.inc();
        let outcome = compute();
        let entry = Entry {
            inputs: inputs
                .iter()
                .map(|(k, v)| (Box::from(*k), Box::from(*v)))
                .collect(),
            platform,
            outcome: outcome.clone(),
        };
        self.generations.lock().insert(hash, entry, self.half);
        outcome
    }

    fn hash(&self, inputs: &[(&str, &str)], platform: Platform) -> u64 {
        let mut h = self.hasher.build_hasher();
        // `str`'s hash ends each string with a marker, so ("ab", "c") and ("a", "bc") differ.
        inputs.hash(&mut h);
        platform.hash(&mut h);
        h.finish()
    }

    /// The kept outcome for these inputs, moved into the current generation if it was in the
    /// previous one.
    fn lookup(&self, hash: u64, inputs: &[(&str, &str)], platform: Platform) -> Option<Outcome> {
        let mut g = self.generations.lock();
        if let Some(e) = g.current.get(&hash) {
            return e.is_for(inputs, platform).then(|| e.outcome.clone());
        }
        if g.previous.get(&hash)?.is_for(inputs, platform) {
            let entry = g.previous.remove(&hash)?;
            let outcome = entry.outcome.clone();
            g.insert(hash, entry, self.half);
            return Some(outcome);
        }
        None
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.generations.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls answered from the memo.
    pub fn hits(&self) -> &Counter {
        &self.hits
    }

    /// Calls that ran the model (including pods whose inputs are too large to keep).
    pub fn misses(&self) -> &Counter {
        &self.misses
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::index::Index;
    use crate::cluster::test_support::mk_pod;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use std::cell::Cell;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{}{k}", model::PREFIX), (*v).to_owned()))
            .collect()
    }

    /// A decoder the model sizes through the caching-allocator replay.
    const QWEN: &[(&str, &str)] = &[
        ("model", "qwen3-0.6b"),
        ("workload", "inference"),
        ("batch", "4"),
        ("context-tokens", "2048"),
    ];

    fn model(a: &BTreeMap<String, String>, platform: Platform) -> Outcome {
        model::annotations::pod_request_on(a, platform)
    }

    /// Calls the memo, counting how often it ran the model.
    fn ask(
        memo: &RequestMemo,
        a: &BTreeMap<String, String>,
        platform: Platform,
        runs: &Cell<u32>,
    ) -> Outcome {
        memo.get_or_compute(a, platform, || {
            runs.set(runs.get() + 1);
            model(a, platform)
        })
    }

    #[test]
    fn a_hit_is_what_a_fresh_run_returns() {
        let memo = RequestMemo::default();
        let runs = Cell::new(0);
        let a = ann(QWEN);
        let p = Platform::default();
        let first = ask(&memo, &a, p, &runs);
        let second = ask(&memo, &a, p, &runs);
        assert!(matches!(first, Ok(Some(_))), "{first:?}");
        assert_eq!(second, model(&a, p));
        assert_eq!(first, second);
        assert_eq!(runs.get(), 1, "the second call is answered from the memo");
        assert_eq!((memo.hits().get(), memo.misses().get()), (1, 1));
    }

    #[test]
    fn a_changed_input_or_platform_is_a_miss() {
        let memo = RequestMemo::default();
        let runs = Cell::new(0);
        let p = Platform::default();
        let small = ask(&memo, &ann(QWEN), p, &runs);
        let mut larger = ann(QWEN);
        larger.insert("peakfit.io/batch".into(), "8".into());
        let big = ask(&memo, &larger, p, &runs);
        assert_eq!(runs.get(), 2);
        assert_eq!(big, model(&larger, p));
        assert_ne!(small, big);
        let other = Platform {
            cuda_context: p.cuda_context + (256 << 20),
        };
        let elsewhere = ask(&memo, &ann(QWEN), other, &runs);
        assert_eq!(runs.get(), 3, "another platform is another key");
        assert_eq!(elsewhere, model(&ann(QWEN), other));
        assert_ne!(elsewhere, small);
        // A value moved to another key is another input, though the strings concatenate alike.
        let memo = RequestMemo::default();
        let runs = Cell::new(0);
        let a = ann(&[("vram", "20Gi"), ("gpus", "2")]);
        let b = ann(&[("vram", "20Gi"), ("gpus", "1")]);
        assert_ne!(ask(&memo, &a, p, &runs), ask(&memo, &b, p, &runs));
        assert_eq!(runs.get(), 2);
    }

    #[test]
    fn what_the_model_skips_shares_the_entry() {
        let memo = RequestMemo::default();
        let runs = Cell::new(0);
        let p = Platform::default();
        let pending = ann(QWEN);
        let mut bound = pending.clone();
        bound.insert(crate::cluster::index::ASSIGNED_GPUS.into(), "GPU-1".into());
        bound.insert(crate::cluster::index::RESERVED_BYTES.into(), "123".into());
        bound.insert("example.com/team".into(), "ml".into());
        assert_eq!(ask(&memo, &pending, p, &runs), ask(&memo, &bound, p, &runs));
        assert_eq!(runs.get(), 1);
    }

    #[test]
    fn an_error_is_kept_with_its_message() {
        let memo = RequestMemo::default();
        let runs = Cell::new(0);
        let mut bad = ann(QWEN);
        bad.insert("peakfit.io/batch".into(), "0".into());
        let p = Platform::default();
        let first = ask(&memo, &bad, p, &runs).unwrap_err();
        let again = ask(&memo, &bad, p, &runs).unwrap_err();
        assert_eq!(runs.get(), 1, "the error came from the memo");
        assert_eq!(again.to_string(), first.to_string());
        assert_eq!(again, model(&bad, p).unwrap_err());
        assert!(again.to_string().contains("peakfit.io/batch"), "{again}");
    }

    #[test]
    fn the_bound_holds_and_recent_keys_stay() {
        let memo = RequestMemo::with_capacity(8);
        let runs = Cell::new(0);
        let p = Platform::default();
        let hot = ann(&[("vram", "1Gi")]);
        for i in 0..100 {
            let a = ann(&[("vram", &format!("{}Mi", 2048 + i))]);
            ask(&memo, &a, p, &runs).unwrap();
            // Asked about between every two new keys: never dropped.
            ask(&memo, &hot, p, &runs).unwrap();
            assert!(memo.len() <= 8, "{} entries", memo.len());
        }
        assert_eq!(runs.get(), 101, "the hot key ran once");
        // An old key was dropped and runs again.
        ask(&memo, &ann(&[("vram", "2048Mi")]), p, &runs).unwrap();
        assert_eq!(runs.get(), 102);
    }

    #[test]
    fn pods_without_inputs_and_huge_inputs_are_not_kept() {
        let memo = RequestMemo::default();
        let runs = Cell::new(0);
        let p = Platform::default();
        let foreign: BTreeMap<String, String> = [("example.com/x".into(), "y".into())].into();
        assert_eq!(ask(&memo, &foreign, p, &runs), Ok(None));
        let huge = ann(&[("vram", "20Gi"), ("model", &"m".repeat(MAX_INPUT_BYTES))]);
        let first = ask(&memo, &huge, p, &runs);
        assert_eq!(ask(&memo, &huge, p, &runs), first);
        assert_eq!(runs.get(), 3, "every call ran");
        assert!(memo.is_empty());
        assert_eq!((memo.hits().get(), memo.misses().get()), (0, 2));
    }

    const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "tie_word_embeddings": true, "torch_dtype": "bfloat16"}"#;

    fn config_map(json: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("llama".into()),
                namespace: Some("ml".into()),
                labels: Some(
                    [(
                        crate::cluster::model_config::WATCH_LABEL.to_owned(),
                        "true".to_owned(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some(
                [(
                    crate::cluster::model_config::CONFIG_KEY.to_owned(),
                    json.to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    /// Through the index: a pod asked about again is a hit; its ConfigMap changed (or gone) is
    /// a miss whose answer is the new ConfigMap's.
    #[test]
    fn a_changed_configmap_is_a_miss() {
        let index = Index::new();
        index.apply_model_config(&config_map(LLAMA));
        let pod = mk_pod(
            "p",
            None,
            &[
                ("peakfit.io/model-config", "llama"),
                ("peakfit.io/workload", "inference"),
                ("peakfit.io/batch", "4"),
            ],
        );
        let memo = &index.request_memo;
        let before = index.request_of(&pod);
        assert!(matches!(before, Ok(Some(_))), "{before:?}");
        assert_eq!(index.request_of(&pod), before);
        assert_eq!((memo.hits().get(), memo.misses().get()), (1, 1));
        let bigger = LLAMA.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 32");
        index.apply_model_config(&config_map(&bigger));
        let misses = memo.misses().get();
        let after = index.request_of(&pod);
        assert!(memo.misses().get() > misses, "a new ConfigMap is a new key");
        let fresh = {
            let merged = index
                .model_configs()
                .resolve("ml", pod.metadata.annotations.as_ref().unwrap())
                .unwrap()
                .unwrap();
            model(&merged, Platform::default())
        };
        assert_eq!(after, fresh);
        assert_ne!(after, before);
        index.delete_model_config("ml", "llama");
        let gone = index.request_of(&pod).unwrap_err();
        assert!(gone.to_string().contains("no ConfigMap ml/llama"), "{gone}");
    }
}
