//! Scaffolding: replaced by `peakfit estimate`.

#[derive(Clone, Debug, clap::Args)]
pub struct EstimateArgs {}

pub fn run(_args: EstimateArgs) -> anyhow::Result<()> {
    anyhow::bail!("peakfit estimate is not built yet")
}
