//! Scaffolding: replaced by the extender implementation.

#[derive(Clone, Debug, clap::Args)]
pub struct ExtenderArgs {}

pub async fn run(_args: ExtenderArgs) -> anyhow::Result<()> {
    anyhow::bail!("peakfit extender is not built yet")
}
