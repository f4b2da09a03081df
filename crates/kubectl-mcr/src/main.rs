//! `kubectl mcr`: drives the rollouts of multicluster-runtime propagations
//! from the command line, as `kubectl rollout` drives a Deployment's, and
//! takes members out for maintenance. It reads and writes only the hub
//! cluster (the one the kubeconfig's context names), through the
//! annotations, labels and status the propagation already uses: nothing
//! it does needs the controller to know of it.

mod hub;
mod maintenance;
mod members;
mod rollout;
mod target;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Drive the rollouts of multicluster-runtime propagations and take members out for maintenance
#[derive(Parser)]
#[command(name = "kubectl-mcr", bin_name = "kubectl mcr", version, about)]
struct Args {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: Command,
}

/// Where the hub is and how long a request to it may take.
#[derive(clap::Args)]
pub(crate) struct Connection {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context naming the hub cluster (default: its current context)
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace of the object (default: the context's, then `default`)
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// How long one request to the hub may wait for its answer
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// A hub object's rollout: status, pause, resume, approve, undo, history
    Rollout {
        #[command(subcommand)]
        command: rollout::Command,
    },
    /// Each member's state with a hub object (TYPE/NAME), from its status
    Members {
        /// The hub object, as TYPE/NAME (fleetdeployments/web, configmap/settings)
        object: String,
    },
    /// Keep a member out of every rollout: it gets no new revision and keeps what it has
    Cordon {
        /// The member's inventory object, as TYPE/NAME (secret/east, clusterprofile/east)
        object: String,
    },
    /// Put a cordoned or drained member back into service: it catches up
    Uncordon {
        /// The member's inventory object, as TYPE/NAME
        object: String,
    },
    /// Take a member out: what was propagated to it goes (or stays, by each propagation's deletion policy), latest wave first
    Drain {
        /// The member's inventory object, as TYPE/NAME
        object: String,
    },
}

/// What went wrong, said to the user (never a credential: the hub's
/// errors are the API server's status messages).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    Hub(#[from] kube::Error),
    #[error("{0}")]
    Refused(String),
    /// A wait that ran out: kubectl's own words and exit code.
    #[error("timed out waiting for the condition")]
    TimedOut,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, Error> {
    let hub = hub::Hub::connect(&args.connection).await?;
    match args.command {
        Command::Rollout { command } => rollout::run(&hub, command).await,
        Command::Members { object } => members::run(&hub, &object).await,
        Command::Cordon { object } => {
            maintenance::run(&hub, &object, maintenance::Verb::Cordon).await
        }
        Command::Uncordon { object } => {
            maintenance::run(&hub, &object, maintenance::Verb::Uncordon).await
        }
        Command::Drain { object } => {
            maintenance::run(&hub, &object, maintenance::Verb::Drain).await
        }
    }
}
