//! How long a control plane takes from `start()` to a ready API server, with
//! the binaries already built. Run with `make bench` or
//! `cargo bench -p multicluster-envtest --bench start`.

use std::time::{Duration, Instant};

use multicluster_envtest::ControlPlane;

const RUNS: usize = 5;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), multicluster_envtest::Error> {
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        let cp = ControlPlane::start().await?;
        times.push(started.elapsed());
        drop(cp);
    }
    times.sort();
    let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
    println!(
        "control plane start to ready ({RUNS} runs): min {} median {} max {}",
        secs(times[0]),
        secs(times[RUNS / 2]),
        secs(times[RUNS - 1])
    );
    Ok(())
}
