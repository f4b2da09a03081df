//! Starts a local control plane (etcd, kube-apiserver and, unless
//! `--no-controller-manager`, kube-controller-manager) with the test control
//! plane crate, writes its admin kubeconfig, and keeps
//! it running until Ctrl-C or SIGTERM. `make demo` uses it; so can you.

use std::path::PathBuf;

use clap::Parser;
use multicluster_envtest::ControlPlane;

/// Run a local Kubernetes control plane for demos.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Where to write the admin kubeconfig.
    #[arg(long, default_value = "local-control-plane.kubeconfig")]
    kubeconfig: PathBuf,
    /// Run no kube-controller-manager (nothing then makes namespaces'
    /// default ServiceAccounts or collects garbage), for a test that plays
    /// controllers itself.
    #[arg(long)]
    no_controller_manager: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let control_plane = ControlPlane::builder()
        .controller_manager(!args.no_controller_manager)
        .start()
        .await?;
    std::fs::write(
        &args.kubeconfig,
        multicluster_envtest::to_yaml(control_plane.kubeconfig())?,
    )?;
    // Listening before saying so: a SIGTERM sent as soon as "ready" is read
    // would otherwise kill the process before it could clean up.
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    println!(
        "control plane ready at {}; kubeconfig written to {}",
        control_plane.server(),
        args.kubeconfig.display()
    );
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    // Dropping the control plane stops its processes and removes its data.
    drop(control_plane);
    let _ = std::fs::remove_file(&args.kubeconfig);
    println!("control plane stopped");
    Ok(())
}
