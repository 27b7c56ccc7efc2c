//! The label of `peakfit_index_warnings_total` and of the extender's other per-reason series.
//! It lives beside the index, which counts with it, so that `metrics` depends on the index and
//! never the index on `metrics` (`cluster`'s rule: the extender and its metrics read the index).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::Index;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

impl Index {
    pub(crate) fn warn_metric(&self, reason: &'static str) {
        self.warnings.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// The warning counters, for the metrics registry to export.
    pub fn warnings(&self) -> &Family<ReasonLabels, Counter> {
        &self.warnings
    }
}
