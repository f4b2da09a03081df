//! Runs {{project-name}} against the cluster `$KUBECONFIG` points at (or the
//! one it runs in) until SIGTERM or Ctrl-C.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| multicluster_runtime::LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let manager = {{crate_name}}::manager(kube::Client::try_default().await?);
    manager.add_controller({{crate_name}}::controller()?)?;
    manager.run_until_signal().await?;
    Ok(())
}
