//! The built-in default cluster and workload.

pub fn run(_args: &super::SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("the built-in default is not built yet: pass --trace-dir")
}
