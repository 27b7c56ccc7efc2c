//! Scaffolding: replaced by the agent implementation.

#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {}

pub async fn run(_args: AgentArgs) -> anyhow::Result<()> {
    anyhow::bail!("peakfit agent is not built yet")
}
