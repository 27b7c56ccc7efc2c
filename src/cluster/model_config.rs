//! `peakfit.io/model-config: NAME`: a pod's model described by its Hugging Face `config.json`,
//! kept in a ConfigMap `NAME` of the pod's namespace under the key `config.json`.
//!
//! The extender watches only ConfigMaps labelled `peakfit.io/model-config: "true"`. The issue
//! asked for ConfigMaps carrying an annotation, but the API server selects by label only: an
//! annotation would mean watching (and holding) every ConfigMap of the cluster to find the few
//! meant for peakfit. Each labelled ConfigMap is parsed once, when it arrives, into the
//! annotations it implies (or the error it gives); a pod naming it gets those annotations under
//! its own (the pod's win), as `peakfit estimate --model-config` merges them.
//!
//! A pod naming a ConfigMap that is missing, unlabelled, lacks `config.json`, is larger than
//! [`MAX_CONFIG_BYTES`] or cannot be read is refused by filter with that reason; other pods are
//! untouched. A bound pod keeps what bind reserved (`reserved-bytes`) when its ConfigMap later
//! changes or goes. `--model-config-watch false` (chart `extender.modelConfigWatch`) starts no
//! watch: every pod naming a ConfigMap is then refused with the switch named.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use parking_lot::RwLock;

use crate::model::{AnnotationError, PREFIX, hf_config};

/// The pod annotation naming the ConfigMap.
pub const MODEL_CONFIG: &str = "peakfit.io/model-config";
/// The label a ConfigMap carries to be read (value `"true"`); the watch's label selector.
pub const WATCH_LABEL: &str = "peakfit.io/model-config";
/// The ConfigMap key holding the Hugging Face config.
pub const CONFIG_KEY: &str = "config.json";
/// The largest `config.json` read: real ones are a few KiB (the CLI's cap too).
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// The label selector of the ConfigMap watch.
pub fn label_selector() -> String {
    format!("{WATCH_LABEL}=true")
}

type Parsed = Result<BTreeMap<String, String>, String>;

/// The labelled ConfigMaps the extender knows, by namespace and name, already parsed.
#[derive(Debug, Default)]
pub struct ModelConfigs {
    by_name: RwLock<HashMap<(String, String), Parsed>>,
    /// The extender runs without the ConfigMap watch (`--model-config-watch false`): no
    /// ConfigMap will ever be known, so a pod naming one is told why at once.
    off: AtomicBool,
}

/// What a ConfigMap's `config.json` says, prefixed, or why it cannot be used.
fn parse(cm: &ConfigMap) -> Parsed {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(CONFIG_KEY)) else {
        let binary = cm
            .binary_data
            .as_ref()
            .is_some_and(|d| d.contains_key(CONFIG_KEY));
        return Err(if binary {
            format!("key {CONFIG_KEY} is in binaryData; put the JSON text under data")
        } else {
            format!("has no key {CONFIG_KEY} under data")
        });
    };
    if text.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "key {CONFIG_KEY} is {} bytes, more than a config.json ({MAX_CONFIG_BYTES} at most)",
            text.len()
        ));
    }
    let parsed = hf_config::annotations(text).map_err(|e| format!("key {CONFIG_KEY}: {e}"))?;
    Ok(parsed
        .annotations
        .into_iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v))
        .collect())
}

fn key_of(cm: &ConfigMap) -> (String, String) {
    (
        cm.metadata.namespace.clone().unwrap_or_default(),
        cm.metadata.name.clone().unwrap_or_default(),
    )
}

impl ModelConfigs {
    /// Records a ConfigMap (new or changed). One that lost the label is forgotten.
    pub fn apply(&self, cm: &ConfigMap) {
        let labelled = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(WATCH_LABEL))
            .is_some_and(|v| v == "true");
        let key = key_of(cm);
        if !labelled {
            self.by_name.write().remove(&key);
            return;
        }
        let parsed = parse(cm);
        if let Err(e) = &parsed {
            tracing::info!(namespace = %key.0, name = %key.1, error = %e, "model-config ConfigMap cannot be used");
        }
        self.by_name.write().insert(key, parsed);
    }

    pub fn delete(&self, namespace: &str, name: &str) {
        self.by_name
            .write()
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The ConfigMap watch is off: every pod naming a ConfigMap (and giving no `vram`) is
    /// refused with the switch named, rather than as if its ConfigMap were missing.
    pub fn turn_off(&self) {
        self.off.store(true, Ordering::Release);
    }

    pub fn len(&self) -> usize {
        self.by_name.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pod's annotations with its ConfigMap's under them, `model-config` dropped; the pod's
    /// own annotations unchanged when it names none. A `vram` pod needs no config: its
    /// ConfigMap is not looked up.
    pub fn resolve(
        &self,
        namespace: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<BTreeMap<String, String>>, AnnotationError> {
        let Some(name) = annotations.get(MODEL_CONFIG) else {
            return Ok(None);
        };
        let name = name.trim();
        let given = |k: &str| annotations.contains_key(&format!("{PREFIX}{k}"));
        let mut merged = if given("vram") {
            BTreeMap::new()
        } else if self.off.load(Ordering::Acquire) {
            return Err(AnnotationError::new(
                "model-config",
                name,
                "nothing while the extender's ConfigMap watch is off (--model-config-watch \
                 false, chart value extender.modelConfigWatch): describe the model with the \
                 other peakfit.io annotations or give peakfit.io/vram",
            ));
        } else {
            let table = self.by_name.read();
            match table.get(&(namespace.to_owned(), name.to_owned())) {
                Some(Ok(config)) => config.clone(),
                Some(Err(why)) => {
                    return Err(AnnotationError::new(
                        "model-config",
                        name,
                        format!("ConfigMap {namespace}/{name} {why}"),
                    ));
                }
                None => {
                    return Err(AnnotationError::new(
                        "model-config",
                        name,
                        format!(
                            "no ConfigMap {namespace}/{name} labelled {WATCH_LABEL}: \"true\" is \
                             known to the extender (create it in the pod's namespace with the \
                             model's config.json under data key {CONFIG_KEY}, and the label)"
                        ),
                    ));
                }
            }
        };
        merged.extend(
            annotations
                .iter()
                .filter(|(k, _)| k.as_str() != MODEL_CONFIG)
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        Ok(Some(merged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn cm(name: &str, labelled: bool, data: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ml".into()),
                labels: labelled.then(|| [(WATCH_LABEL.to_owned(), "true".to_owned())].into()),
                ..Default::default()
            },
            data: data.map(|d| [(CONFIG_KEY.to_owned(), d.to_owned())].into()),
            ..Default::default()
        }
    }

    fn pod(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), (*v).to_owned()))
            .collect()
    }

    const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;

    #[test]
    fn the_pods_annotations_override_its_configs() {
        let configs = ModelConfigs::default();
        configs.apply(&cm("llama", true, Some(LLAMA)));
        let merged = configs
            .resolve(
                "ml",
                &pod(&[("model-config", "llama"), ("dtype", "fp8"), ("batch", "4")]),
            )
            .unwrap()
            .unwrap();
        assert_eq!(merged[&format!("{PREFIX}layers")], "32");
        assert_eq!(merged[&format!("{PREFIX}dtype")], "fp8", "the pod wins");
        assert_eq!(merged[&format!("{PREFIX}batch")], "4");
        assert!(!merged.contains_key(MODEL_CONFIG));
        let request = crate::model::pod_request(&merged).unwrap().unwrap();
        assert!(request.demand.fixed_bytes > 8_000_000_000);
        // No model-config: nothing to resolve.
        assert_eq!(
            configs.resolve("ml", &pod(&[("vram", "8Gi")])).unwrap(),
            None
        );
    }

    #[test]
    fn missing_or_bad_configs_name_the_configmap_and_field() {
        let configs = ModelConfigs::default();
        configs.apply(&cm("nojson", true, None));
        configs.apply(&cm("broken", true, Some("{\"hidden_size\": 8}")));
        configs.apply(&cm("unlabelled", false, Some(LLAMA)));
        configs.apply(&cm("huge", true, Some(&" ".repeat(MAX_CONFIG_BYTES + 1))));
        let err = |name: &str, ns: &str| {
            configs
                .resolve(ns, &pod(&[("model-config", name)]))
                .unwrap_err()
                .to_string()
        };
        let e = err("nojson", "ml");
        assert!(
            e.contains("peakfit.io/model-config")
                && e.contains("ml/nojson")
                && e.contains("config.json"),
            "{e}"
        );
        let e = err("broken", "ml");
        assert!(e.contains("ml/broken") && e.contains("vocab_size"), "{e}");
        let e = err("unlabelled", "ml");
        assert!(e.contains("no ConfigMap ml/unlabelled labelled"), "{e}");
        // Same name, another namespace: not the pod's.
        let e = err("broken", "other");
        assert!(e.contains("no ConfigMap other/broken"), "{e}");
        let e = err("huge", "ml");
        assert!(e.contains("at most"), "{e}");
        // A pod that gives vram does not need its config.
        assert!(
            configs
                .resolve("ml", &pod(&[("model-config", "nojson"), ("vram", "8Gi")]))
                .is_ok()
        );
    }

    #[test]
    fn a_configmap_that_loses_its_label_or_goes_is_forgotten() {
        let configs = ModelConfigs::default();
        configs.apply(&cm("llama", true, Some(LLAMA)));
        assert_eq!(configs.len(), 1);
        configs.apply(&cm("llama", false, Some(LLAMA)));
        assert!(configs.is_empty());
        configs.apply(&cm("llama", true, Some(LLAMA)));
        configs.delete("ml", "llama");
        assert!(configs.is_empty());
    }

    #[test]
    fn with_the_watch_off_a_pod_naming_a_configmap_is_told_so() {
        let configs = ModelConfigs::default();
        configs.apply(&cm("llama", true, Some(LLAMA)));
        configs.turn_off();
        let e = configs
            .resolve("ml", &pod(&[("model-config", "llama")]))
            .unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("model-config", "llama")
        );
        assert!(e.allowed.contains("--model-config-watch"), "{e}");
        assert!(e.allowed.contains("extender.modelConfigWatch"), "{e}");
        // A pod giving vram needs no config, and one naming none is untouched.
        assert!(
            configs
                .resolve("ml", &pod(&[("model-config", "llama"), ("vram", "10Gi")]))
                .unwrap()
                .is_some()
        );
        assert!(
            configs
                .resolve("ml", &pod(&[("vram", "10Gi")]))
                .unwrap()
                .is_none()
        );
    }
}
