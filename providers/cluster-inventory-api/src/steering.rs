//! One plugin input, one server: the rule that keeps a profile from
//! having the operator's plugin mint another member's credential for a
//! server of its choosing.
//!
//! The plugin mints what the profile's data asks for (the exec extension
//! it is handed, the arguments and variables the provider file lets a
//! profile add: [`crate::access::ProfileAccess::input`]), and the
//! credential goes to the server the profile names. By default a plugin
//! that receives such data runs only for servers the operator named one
//! by one ([`crate::access::AccessProvider::unbound_profile_input`]); a
//! profile naming a server outside them never reaches this module. Among
//! the servers that remain (all of them the operator's, or any under
//! `allowUnboundProfileInput`), this rule holds under every binding:
//!
//! - **An input goes to one server.** Once a profile was engaged with an
//!   input and a server in this process, a profile handing the plugin
//!   the same input (compared by meaning) and naming another server is
//!   refused, the engaged one itself included (its cluster keeps its
//!   engaged client), until every profile engaged with it is gone or
//!   engaged with another input.
//! - **Before any is engaged, the oldest claims it.** Of the profiles
//!   handing the plugin an input (the hub cache's index of them, so
//!   profiles not looked at yet count too: a restart changes nothing),
//!   the oldest (`creationTimestamp`, then namespace and name) decides
//!   the server, whether or not it is ready: a copy made later is refused
//!   while its victim is not ready or not engaged yet, and the victim is
//!   never refused for it. A profile the provider file refuses (a server
//!   outside the binding) hands nothing and claims nothing.
//!
//! A profile refused here is shown `unusable` with the profile it yields
//! to; its plugin does not run.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The name of the hub cache's index of profiles by the input they hand
/// their plugin ([`crate::access::ProfileAccess::input`]).
pub(crate) const INDEX: &str = "access-provider-input";

/// A profile, `<namespace>/<name>`.
pub(crate) type ProfileKey = String;

/// A profile handing the plugin an input, as the steering rule compares
/// them.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    /// `<namespace>/<name>`.
    pub(crate) profile: ProfileKey,
    /// The server it names.
    pub(crate) server: String,
    /// When it was created.
    pub(crate) created: Option<Time>,
}

impl Claim {
    fn age(&self) -> (Option<&Time>, &str) {
        (self.created.as_ref(), self.profile.as_str())
    }
}

/// The inputs engaged in this process, and with which server.
#[derive(Debug, Default)]
pub(crate) struct Steering {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Per input, the server it was engaged with and the profiles engaged
    /// with it there.
    engaged: HashMap<String, Engaged>,
    /// The input each profile was engaged with last.
    by_profile: HashMap<ProfileKey, String>,
    /// The input each profile handed when last seen, so that those
    /// sharing one it no longer hands are looked at again.
    seen: HashMap<ProfileKey, String>,
}

#[derive(Debug)]
struct Engaged {
    server: String,
    profiles: BTreeSet<ProfileKey>,
}

impl Steering {
    /// Whether `claim`, handing the plugin `input`, may have it run for
    /// its server; `others` are the other live profiles handing the same
    /// input. The reason names the profile it yields to.
    pub(crate) fn check(&self, input: &str, claim: &Claim, others: &[Claim]) -> Result<(), String> {
        let state = crate::lock(&self.state);
        if let Some(engaged) = state.engaged.get(input) {
            if engaged.server == claim.server {
                return Ok(());
            }
            let holder = engaged
                .profiles
                .iter()
                .next()
                .map(String::as_str)
                .unwrap_or_default();
            return Err(if holder == claim.profile {
                "it names a server other than the one it was engaged with, and hands its access provider's plugin the same input; one input's credentials go to one server (the cluster keeps its engaged client; create the profile again to move it)".to_string()
            } else {
                format!(
                    "it hands its access provider's plugin the same input as ClusterProfile {holder}, which was engaged with another server; one input's credentials go to one server"
                )
            });
        }
        let oldest = others
            .iter()
            .chain(std::iter::once(claim))
            .min_by(|a, b| a.age().cmp(&b.age()))
            .unwrap_or(claim);
        if oldest.server == claim.server {
            Ok(())
        } else {
            Err(format!(
                "it hands its access provider's plugin the same input as ClusterProfile {}, which is older and names another server; one input's credentials go to one server (the older one decides until it is engaged or gone)",
                oldest.profile
            ))
        }
    }

    /// `profile` was engaged handing `input` (if any) and naming `server`.
    pub(crate) fn engaged(&self, profile: &str, input: Option<&str>, server: &str) {
        let mut state = crate::lock(&self.state);
        state.release(profile);
        let Some(input) = input else {
            return;
        };
        let engaged = state
            .engaged
            .entry(input.to_string())
            .or_insert_with(|| Engaged {
                server: server.to_string(),
                profiles: BTreeSet::new(),
            });
        // Checked before it was built; another profile engaged with the
        // input meanwhile (for its server) keeps it.
        if engaged.server == server {
            engaged.profiles.insert(profile.to_string());
            state
                .by_profile
                .insert(profile.to_string(), input.to_string());
        }
    }

    /// `profile` is gone: what it was engaged with is free.
    pub(crate) fn forget(&self, profile: &str) {
        let mut state = crate::lock(&self.state);
        state.release(profile);
        state.seen.remove(profile);
    }

    /// `profile` hands `input` now: returns the inputs it handed before
    /// or was engaged with, whose other profiles a change of it may
    /// concern.
    pub(crate) fn seen(&self, profile: &str, input: Option<&str>) -> Vec<String> {
        let mut state = crate::lock(&self.state);
        let before = match input {
            Some(input) => state.seen.insert(profile.to_string(), input.to_string()),
            None => state.seen.remove(profile),
        };
        let mut inputs: Vec<String> = before
            .into_iter()
            .chain(state.by_profile.get(profile).cloned())
            .chain(input.map(str::to_string))
            .collect();
        inputs.sort();
        inputs.dedup();
        inputs
    }

    /// The profiles engaged with `input`.
    pub(crate) fn engaged_with(&self, input: &str) -> Vec<ProfileKey> {
        let state = crate::lock(&self.state);
        state
            .engaged
            .get(input)
            .map(|engaged| engaged.profiles.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl State {
    /// Drops `profile` from the input it was engaged with.
    fn release(&mut self, profile: &str) {
        let Some(input) = self.by_profile.remove(profile) else {
            return;
        };
        if let Some(engaged) = self.engaged.get_mut(&input) {
            engaged.profiles.remove(profile);
            if engaged.profiles.is_empty() {
                self.engaged.remove(&input);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(profile: &str, server: &str, created: i64) -> Claim {
        Claim {
            profile: profile.to_string(),
            server: server.to_string(),
            created: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(created).expect("time"),
            )),
        }
    }

    const INPUT: &str = r#"{"input":{"config":{"cluster":"a"}},"provider":"p"}"#;

    #[test]
    fn an_engaged_input_keeps_its_server_for_everyone_itself_included() {
        let steering = Steering::default();
        let victim = claim("ns/a", "https://a", 1);
        let thief = claim("ns/thief", "https://stranger", 0);
        steering.check(INPUT, &victim, &[]).expect("alone");
        steering.engaged("ns/a", Some(INPUT), "https://a");
        // Engaged first: even an older copy is refused now.
        let refused = steering
            .check(INPUT, &thief, std::slice::from_ref(&victim))
            .expect_err("copy");
        assert!(
            refused.contains("ClusterProfile ns/a, which was engaged"),
            "{refused}"
        );
        let moved = steering
            .check(INPUT, &claim("ns/a", "https://stranger", 1), &[])
            .expect_err("moved");
        assert!(
            moved.contains("other than the one it was engaged with"),
            "{moved}"
        );
        steering
            .check(INPUT, &claim("ns/twin", "https://a", 5), &[])
            .expect("the same server");
        assert_eq!(steering.engaged_with(INPUT), ["ns/a"]);
        // Engaged with another input: the first is free.
        steering.engaged("ns/a", Some("other"), "https://a");
        steering.check(INPUT, &thief, &[]).expect("free");
        steering.forget("ns/a");
        assert!(steering.engaged_with("other").is_empty());
    }

    #[test]
    fn before_any_is_engaged_the_oldest_decides_whether_it_is_looked_at_first_or_not() {
        let steering = Steering::default();
        let victim = claim("ns/victim", "https://victim", 10);
        let thief = claim("ns/thief", "https://stranger", 20);
        // The thief looked at first (a restart), the victim not ready.
        let refused = steering
            .check(INPUT, &thief, std::slice::from_ref(&victim))
            .expect_err("younger copy");
        assert!(
            refused.contains("ClusterProfile ns/victim, which is older"),
            "{refused}"
        );
        steering
            .check(INPUT, &victim, std::slice::from_ref(&thief))
            .expect("the victim is never refused for its copy");
        // Same creation second: the name decides, the same way each time.
        let a = claim("ns/a", "https://a", 10);
        let b = claim("ns/b", "https://b", 10);
        assert!(steering.check(INPUT, &a, std::slice::from_ref(&b)).is_ok());
        assert!(steering.check(INPUT, &b, std::slice::from_ref(&a)).is_err());
    }

    #[test]
    fn what_a_profile_handed_before_is_told_so_that_its_sharers_are_looked_at_again() {
        let steering = Steering::default();
        assert_eq!(steering.seen("ns/a", Some(INPUT)), [INPUT]);
        steering.engaged("ns/a", Some(INPUT), "https://a");
        assert_eq!(steering.seen("ns/a", Some("new")), ["new", INPUT], "sorted");
        steering.forget("ns/a");
        assert_eq!(steering.seen("ns/a", None), Vec::<String>::new());
    }
}
