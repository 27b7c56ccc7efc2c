//! Scaffolding: replaced by the simulator.

#[derive(Clone, Debug, clap::Args)]
pub struct SimulateArgs {}

pub fn run(_args: SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("peakfit simulate is not built yet")
}
