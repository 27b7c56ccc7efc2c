//! Scaffolding: replaced by the webhook implementation.

#[derive(Clone, Debug, clap::Args)]
pub struct WebhookArgs {}

pub async fn run(_args: WebhookArgs) -> anyhow::Result<()> {
    anyhow::bail!("peakfit webhook is not built yet")
}
