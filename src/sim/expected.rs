//! The FGD authors' own results (`expected/analysis_allo_discrete.csv`): GPU allocation % at each
//! arrived % per (trace, policy, seed). Read to check the reproduction and to print the paper's
//! figure beside ours.

use std::collections::BTreeMap;
use std::path::Path;

use super::openb::TraceError;

/// Allocation % at arrived = 100 % per (trace short name, paper policy name), one value per seed.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    pub at_100: BTreeMap<(String, String), BTreeMap<u64, f64>>,
}

impl Expected {
    pub fn load(path: &Path) -> Result<Self, TraceError> {
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut rdr = csv::Reader::from_reader(file);
        let csv_err = |source| TraceError::Csv {
            path: path.to_owned(),
            source,
        };
        let headers = rdr.headers().map_err(csv_err)?.clone();
        let col = |name: &'static str| {
            headers
                .iter()
                .position(|h| h == name)
                .ok_or(TraceError::MissingColumn {
                    path: path.to_owned(),
                    column: name,
                    expected: "workload, sc_policy, tune, seed, total_gpus, 0..130",
                })
        };
        let (w, p, s, c100) = (
            col("workload")?,
            col("sc_policy")?,
            col("seed")?,
            col("100")?,
        );
        let mut out = Self::default();
        for row in rdr.records() {
            let row = row.map_err(csv_err)?;
            let (Some(seed), Some(alloc)) = (
                row.get(s).and_then(|v| v.parse::<u64>().ok()),
                row.get(c100).and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            let trace = row
                .get(w)
                .unwrap_or("")
                .trim_start_matches("openb_pod_list_")
                .to_owned();
            out.at_100
                .entry((trace, row.get(p).unwrap_or("").to_owned()))
                .or_default()
                .insert(seed, alloc);
        }
        Ok(out)
    }

    /// The authors' mean unallocated % at arrived = 100 % over `seeds` (those present).
    pub fn unallocated_at_100(
        &self,
        trace: &str,
        paper_policy: &str,
        seeds: &[u64],
    ) -> Option<f64> {
        let per_seed = self
            .at_100
            .get(&(trace.to_owned(), paper_policy.to_owned()))?;
        let vals: Vec<f64> = seeds
            .iter()
            .filter_map(|s| per_seed.get(s).map(|a| 100.0 - a))
            .collect();
        (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
    }
}
