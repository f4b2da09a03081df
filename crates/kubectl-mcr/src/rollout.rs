//! `kubectl mcr rollout ...`: a hub object's rollout, as `kubectl
//! rollout` shows and drives a Deployment's, through the annotations the
//! propagation reads (pause, approval, roll back) and the status and
//! ControllerRevisions it writes.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use multicluster_propagation::{
    APPROVAL_ANNOTATION, PAUSE_ANNOTATION, PROPAGATION_LABEL, REVISION_ANNOTATION,
    ROLL_BACK_ANNOTATION,
};

use crate::Error;
use crate::hub::{Hub, HubObject, Seen};
use crate::members::table;

#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Show the rollout's progress and wait until it is done (exit 1 if it halts or the timeout passes)
    Status {
        /// The hub object, as TYPE/NAME
        object: String,
        /// Wait until the rollout is done; with --watch=false, print once
        #[arg(short, long, default_value_t = true, action = clap::ArgAction::Set)]
        watch: bool,
        /// How long to wait ("0s": for ever)
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Give no member a new slot (those holding one go on)
    Pause {
        /// The hub object, as TYPE/NAME
        object: String,
    },
    /// Let a paused rollout go on
    Resume {
        /// The hub object, as TYPE/NAME
        object: String,
    },
    /// Approve a stage for the revision being rolled out
    Approve {
        /// The hub object, as TYPE/NAME
        object: String,
        /// The stage's name
        stage: String,
        /// The revision approved (default: the one the status says is rolled out)
        #[arg(long)]
        revision: Option<String>,
    },
    /// Roll the members back to an earlier revision, paced as a rollout is
    Undo {
        /// The hub object, as TYPE/NAME
        object: String,
        /// The revision to go back to (default: the last complete one, else the one before)
        #[arg(long, conflicts_with = "cancel")]
        to_revision: Option<String>,
        /// Stop rolling back: the object's own revision rolls out again
        #[arg(long)]
        cancel: bool,
    },
    /// The kept revisions of the object (its ControllerRevisions)
    History {
        /// The hub object, as TYPE/NAME
        object: String,
        /// Print this revision's kept object
        #[arg(long)]
        revision: Option<String>,
    },
}

pub(crate) async fn run(hub: &Hub, command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Status {
            object,
            watch,
            timeout,
        } => status(hub, &HubObject::find(hub, &object).await?, watch, timeout).await,
        Command::Pause { object } => pause(&HubObject::find(hub, &object).await?, true).await,
        Command::Resume { object } => pause(&HubObject::find(hub, &object).await?, false).await,
        Command::Approve {
            object,
            stage,
            revision,
        } => approve(&HubObject::find(hub, &object).await?, &stage, revision).await,
        Command::Undo {
            object,
            to_revision,
            cancel,
        } => {
            undo(
                hub,
                &HubObject::find(hub, &object).await?,
                to_revision,
                cancel,
            )
            .await
        }
        Command::History { object, revision } => {
            history(hub, &HubObject::find(hub, &object).await?, revision).await
        }
    }
}

/// Where a rollout stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    Done(String),
    Waiting(String),
    Halted(String),
}

/// Where the rollout of `seen` stands. Done means what `kubectl rollout
/// status` means: the revision asked for (the object's own, or the one a
/// roll back goes to) is in sync in every member, no member holding a
/// slot and none left to go.
pub(crate) fn progress(seen: &Seen) -> Progress {
    if !seen.propagated {
        return Progress::Waiting(
            "waiting for a propagation to write the object's status".to_string(),
        );
    }
    let condition = seen.condition.as_ref();
    let in_sync = condition.is_some_and(|condition| condition["status"] == "True");
    let message = condition
        .and_then(|condition| condition["message"].as_str())
        .unwrap_or("no Propagated condition yet");
    // Members the status lists at another revision: not there yet,
    // whatever the summary says (it is written in batches).
    let behind = |revision: &str| -> Vec<&str> {
        seen.members
            .iter()
            .filter(|member| member.revision.as_deref() != Some(revision))
            .map(|member| member.cluster.as_str())
            .take(5)
            .collect()
    };
    let Some(rollout) = &seen.rollout else {
        // All at once: the condition says it, for the object's generation.
        let generation = seen.value.pointer("/metadata/generation");
        let observed = condition.and_then(|condition| condition.get("observedGeneration"));
        return if in_sync
            && (generation.is_none() || generation == observed)
            && behind(&seen.revision).is_empty()
        {
            Progress::Done(format!(
                "revision {} propagated to every member ({message})",
                seen.revision
            ))
        } else {
            Progress::Waiting(format!("waiting: {message}"))
        };
    };
    if let Some(halted) = &rollout.halted {
        return Progress::Halted(format!("rollout halted: {halted}"));
    }
    let wanted = rollout
        .rolling_back
        .as_ref()
        .map_or(seen.revision.as_str(), |back| back.to.as_str());
    if rollout.revision != wanted {
        return Progress::Waiting(format!(
            "waiting for revision {wanted} to be taken up (the rollout is at {})",
            rollout.revision
        ));
    }
    if let Some(waiting) = &rollout.waiting {
        return Progress::Waiting(format!("waiting: {waiting}"));
    }
    let members = rollout.updated + rollout.updating.len() + rollout.remaining;
    if !rollout.updating.is_empty() || rollout.remaining > 0 || !in_sync {
        let updating: Vec<&str> = rollout
            .updating
            .iter()
            .map(|member| member.cluster.as_str())
            .collect();
        let stage = rollout
            .stage
            .as_ref()
            .map(|stage| format!(", stage {stage}"))
            .unwrap_or_default();
        return Progress::Waiting(format!(
            "revision {wanted}{stage}: {} of {members} members updated, updating [{}], {} to go ({message})",
            rollout.updated,
            updating.join(", "),
            rollout.remaining,
        ));
    }
    let behind = behind(wanted);
    if !behind.is_empty() {
        return Progress::Waiting(format!(
            "revision {wanted}: waiting for [{}] to report it",
            behind.join(", ")
        ));
    }
    match &rollout.rolling_back {
        Some(back) => Progress::Done(format!(
            "rolled back to revision {} (from {}) in all {members} members",
            back.to, back.from
        )),
        None => Progress::Done(format!(
            "revision {wanted} successfully rolled out to all {members} members"
        )),
    }
}

async fn status(
    hub: &Hub,
    object: &HubObject,
    watch: bool,
    timeout: Duration,
) -> Result<ExitCode, Error> {
    let shown = &object.shown;
    let mut last = progress(&object.read().await?);
    println!("{shown}: {}", said(&last));
    if !watch || !matches!(last, Progress::Waiting(_)) {
        return Ok(exit_code(&last));
    }
    let wait = async {
        // The server ends each watch before a request may time out; the
        // watcher reopens it where it left off.
        let reopen = u32::try_from(hub.request_timeout.as_secs().saturating_sub(1).max(1))
            .unwrap_or(u32::MAX);
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", object.name))
            .timeout(reopen);
        let mut events = std::pin::pin!(
            watcher(object.api.clone(), config)
                .default_backoff()
                .touched_objects()
        );
        let mut last_error = None;
        while let Some(event) = events.next().await {
            match event {
                Ok(seen) => {
                    if seen.metadata.deletion_timestamp.is_some() {
                        return Err(Error::Refused(format!("{shown} is being deleted")));
                    }
                    let now = progress(&Seen::of(&seen)?);
                    if now != last {
                        println!("{shown}: {}", said(&now));
                        last = now;
                    }
                    if !matches!(last, Progress::Waiting(_)) {
                        return Ok(exit_code(&last));
                    }
                }
                // Retried with backoff; each new error said once.
                Err(err) => {
                    let err = err.to_string();
                    if last_error.as_ref() != Some(&err) {
                        eprintln!("warning: watching {shown}: {err}");
                        last_error = Some(err);
                    }
                }
            }
        }
        Err(Error::Refused(format!("the watch of {shown} ended")))
    };
    if timeout.is_zero() {
        return wait.await;
    }
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| Error::TimedOut)?
}

fn said(progress: &Progress) -> &str {
    match progress {
        Progress::Done(text) | Progress::Waiting(text) | Progress::Halted(text) => text,
    }
}

fn exit_code(progress: &Progress) -> ExitCode {
    match progress {
        Progress::Halted(_) => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    }
}

async fn pause(object: &HubObject, paused: bool) -> Result<ExitCode, Error> {
    let seen = object.read().await?;
    let now = seen.annotation(PAUSE_ANNOTATION) == Some("true");
    let shown = &object.shown;
    match (now, paused) {
        (true, true) => return Err(Error::Refused(format!("{shown} is already paused"))),
        (false, false) => return Err(Error::Refused(format!("{shown} is not paused"))),
        (false, true) => {
            object
                .annotate(PAUSE_ANNOTATION, Some("true"), None)
                .await?
        }
        (true, false) => object.annotate(PAUSE_ANNOTATION, None, None).await?,
    }
    println!("{shown} {}", if paused { "paused" } else { "resumed" });
    Ok(ExitCode::SUCCESS)
}

/// How often a read-modify-write of the approval list is tried when
/// another writer gets there first.
const WRITE_ATTEMPTS: usize = 5;

async fn approve(
    object: &HubObject,
    stage: &str,
    revision: Option<String>,
) -> Result<ExitCode, Error> {
    if stage.is_empty() || stage.contains([',', '@']) {
        return Err(Error::Refused(format!(
            "stage {stage:?}: a stage's name, without ',' or '@'"
        )));
    }
    let shown = &object.shown;
    for _ in 0..WRITE_ATTEMPTS {
        let seen = object.read().await?;
        let revision = match (&revision, &seen.rollout) {
            (Some(revision), _) => revision.clone(),
            (None, Some(rollout)) => rollout.revision.clone(),
            (None, None) => {
                return Err(Error::Refused(format!(
                    "{shown} has no paced rollout in its status: name the revision with --revision"
                )));
            }
        };
        let entry = format!("{stage}@{revision}");
        let mut approved: Vec<String> = seen
            .annotation(APPROVAL_ANNOTATION)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(str::to_string)
            .collect();
        if approved.contains(&entry) {
            println!("{shown}: stage {stage} already approved for revision {revision}");
            return Ok(ExitCode::SUCCESS);
        }
        approved.push(entry);
        match object
            .annotate(
                APPROVAL_ANNOTATION,
                Some(&approved.join(",")),
                seen.resource_version(),
            )
            .await
        {
            Ok(()) => {
                println!("{shown}: stage {stage} approved for revision {revision}");
                return Ok(ExitCode::SUCCESS);
            }
            Err(Error::Hub(kube::Error::Api(status))) if status.code == 409 => continue,
            Err(err) => return Err(err),
        }
    }
    Err(Error::Refused(format!(
        "{shown} kept changing: the approval was not written in {WRITE_ATTEMPTS} attempts"
    )))
}

/// A kept revision of a hub object.
struct Kept {
    revision: String,
    /// Its place in the history (the ControllerRevision's `revision`).
    number: i64,
    propagation: String,
    created: Option<String>,
    object: Option<serde_json::Value>,
}

/// The hub object's kept revisions, oldest first.
async fn kept(hub: &Hub, seen: &Seen) -> Result<Vec<Kept>, Error> {
    let namespace = seen
        .value
        .pointer("/metadata/namespace")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(multicluster_propagation::CLUSTER_SCOPED_HISTORY_NAMESPACE);
    let uid = seen.uid().unwrap_or_default();
    let listed = Api::<ControllerRevision>::namespaced(hub.client.clone(), namespace)
        .list(&ListParams::default().labels(PROPAGATION_LABEL))
        .await?;
    let mut kept: Vec<Kept> = listed
        .items
        .into_iter()
        .filter(|revision| {
            revision
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|owner| owner.uid == uid)
        })
        .filter_map(|revision| {
            let metadata = &revision.metadata;
            Some(Kept {
                revision: metadata
                    .annotations
                    .as_ref()?
                    .get(REVISION_ANNOTATION)?
                    .clone(),
                number: revision.revision,
                propagation: metadata.labels.as_ref()?.get(PROPAGATION_LABEL)?.clone(),
                created: metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|time| time.0.to_string()),
                object: revision.data.map(|data| data.0),
            })
        })
        .collect();
    kept.sort_by_key(|kept| kept.number);
    Ok(kept)
}

async fn history(
    hub: &Hub,
    object: &HubObject,
    revision: Option<String>,
) -> Result<ExitCode, Error> {
    let seen = object.read().await?;
    let kept = kept(hub, &seen).await?;
    let shown = &object.shown;
    if let Some(revision) = revision {
        let Some(found) = kept.iter().find(|kept| kept.revision == revision) else {
            return Err(not_kept(shown, &revision, &kept));
        };
        let text = serde_json::to_string_pretty(&found.object).unwrap_or_default();
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    if kept.is_empty() {
        println!("{shown}: no revision kept (a paced rollout keeps them)");
        return Ok(ExitCode::SUCCESS);
    }
    let rollout = seen.rollout.as_ref();
    let mut rows = vec![
        ["REVISION", "PROPAGATION", "KEPT AT", "NOTE"]
            .map(String::from)
            .to_vec(),
    ];
    for kept in &kept {
        let mut notes = Vec::new();
        if kept.revision == seen.revision {
            notes.push("the object's own");
        }
        if rollout.is_some_and(|rollout| rollout.revision == kept.revision) {
            notes.push("rolled out");
        }
        if rollout.and_then(|rollout| rollout.last_complete.as_deref()) == Some(&kept.revision) {
            notes.push("last complete");
        }
        rows.push(vec![
            kept.revision.clone(),
            kept.propagation.clone(),
            kept.created.clone().unwrap_or_default(),
            notes.join(", "),
        ]);
    }
    print!("{}", table(&rows));
    Ok(ExitCode::SUCCESS)
}

fn not_kept(shown: &str, revision: &str, kept: &[Kept]) -> Error {
    let names: Vec<&str> = kept.iter().map(|kept| kept.revision.as_str()).collect();
    Error::Refused(format!(
        "{shown}: revision {revision} is not kept (kept: {})",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    ))
}

async fn undo(
    hub: &Hub,
    object: &HubObject,
    to_revision: Option<String>,
    cancel: bool,
) -> Result<ExitCode, Error> {
    let seen = object.read().await?;
    let shown = &object.shown;
    if cancel {
        if seen.annotation(ROLL_BACK_ANNOTATION).is_none() {
            return Err(Error::Refused(format!("{shown} is not being rolled back")));
        }
        object.annotate(ROLL_BACK_ANNOTATION, None, None).await?;
        println!(
            "{shown}: roll back cancelled; revision {} rolls out again",
            seen.revision
        );
        return Ok(ExitCode::SUCCESS);
    }
    let kept = kept(hub, &seen).await?;
    let target = match to_revision {
        Some(revision) => {
            if !kept.iter().any(|kept| kept.revision == revision) {
                return Err(not_kept(shown, &revision, &kept));
            }
            revision
        }
        None => {
            let last_complete = seen
                .rollout
                .as_ref()
                .and_then(|rollout| rollout.last_complete.clone())
                .filter(|last| *last != seen.revision && kept.iter().any(|k| k.revision == *last));
            let before = kept
                .iter()
                .rev()
                .find(|kept| kept.revision != seen.revision)
                .map(|kept| kept.revision.clone());
            last_complete.or(before).ok_or_else(|| {
                Error::Refused(format!(
                    "{shown}: no earlier revision is kept to go back to"
                ))
            })?
        }
    };
    if target == seen.revision {
        return Err(Error::Refused(format!(
            "{shown}: revision {target} is the object's own (undo --cancel stops a roll back)"
        )));
    }
    object
        .annotate(ROLL_BACK_ANNOTATION, Some(&target), None)
        .await?;
    println!("{shown}: rolling back to revision {target}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seen(rollout: serde_json::Value, in_sync: bool) -> Seen {
        let revision = rollout_revision(&rollout);
        seen_with(rollout, in_sync, &revision)
    }

    /// The revision `rollout` goes to, as every member's.
    fn rollout_revision(rollout: &serde_json::Value) -> String {
        rollout["revision"].as_str().unwrap_or_default().to_string()
    }

    fn seen_with(rollout: serde_json::Value, in_sync: bool, members_at: &str) -> Seen {
        let object: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleet.example/v1", "kind": "FleetDeployment",
            "metadata": {"name": "web", "generation": 2},
            "status": {"members": [{"cluster": "east", "state": "InSync", "revision": members_at}],
                "rollout": rollout,
                "conditions": [{"type": "Propagated", "status": if in_sync { "True" } else { "False" },
                    "observedGeneration": 2, "message": "m", "reason": "r",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .expect("object");
        Seen::of(&object).expect("seen")
    }

    #[test]
    fn a_rollout_is_done_only_at_the_revision_asked_for_with_nothing_left() {
        let done = |value: serde_json::Value, in_sync| progress(&seen(value, in_sync));
        assert!(matches!(
            done(json!({"revision": "2", "updated": 3}), true),
            Progress::Done(_)
        ));
        // The old revision complete is not the new one's.
        assert!(matches!(
            done(json!({"revision": "1", "updated": 3}), true),
            Progress::Waiting(_)
        ));
        assert!(matches!(
            done(
                json!({"revision": "2", "updated": 2, "remaining": 1}),
                false
            ),
            Progress::Waiting(_)
        ));
        let waiting = done(
            json!({"revision": "2", "updated": 1, "remaining": 2,
            "waiting": "stage main waits for its approval"}),
            false,
        );
        assert_eq!(
            waiting,
            Progress::Waiting("waiting: stage main waits for its approval".into())
        );
        assert!(matches!(
            done(json!({"revision": "2", "halted": "east failed"}), false),
            Progress::Halted(text) if text.contains("east failed")
        ));
        // The summary ahead of a member's own entry is not done.
        assert!(matches!(
            progress(&seen_with(json!({"revision": "2", "updated": 3}), true, "1")),
            Progress::Waiting(text) if text.contains("[east]")
        ));
        // A roll back is done at the revision it goes to.
        let back = json!({"revision": "1", "updated": 3,
            "rollingBack": {"from": "2", "to": "1", "reason": "asked"}});
        assert!(
            matches!(done(back, true), Progress::Done(text) if text.contains("rolled back to revision 1"))
        );
    }
}
