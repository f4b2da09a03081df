//! What a profile may do with an access provider bound to no servers.
//!
//! The plugin is the operator's and mints what the profile's data asks
//! for (the exec extension it is handed, the arguments and variables the
//! provider file lets a profile add), and the token goes to the server
//! the profile names. Whoever may write ClusterProfile status could then
//! name a server of theirs beside another member's data, and receive that
//! member's credential. A provider bound to servers
//! ([`crate::access::AccessProvider::servers`]) refuses such a profile
//! before its plugin runs. One bound to none keeps two rules, which hold
//! wherever a profile's input could steer the plugin:
//!
//! - **A profile stays on the server it was engaged with.** Its status
//!   naming another server later is refused (the cluster keeps its
//!   engaged client), until the profile is deleted and created again or
//!   the provider is bound to servers that admit the new one.
//! - **One input, one server.** Profiles that hand the plugin the same
//!   input ([`crate::access::ProfileAccess::input`]) and name different
//!   servers are refused, except one that was engaged first with its
//!   server: a newcomer copying a member's input cannot take its
//!   credential, nor take the input over when the replica restarts and
//!   neither is engaged (both are refused then, and shown, until one
//!   goes).
//!
//! A profile that hands the plugin nothing of its own (its call differs
//! from another's only by the server) is left alone here: what the plugin
//! mints for it does not depend on the profile, and only a binding keeps
//! it from a server the profile names. The crate README says so.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// A profile, `<namespace>/<name>`.
pub(crate) type ProfileKey = String;

/// The unbound profiles seen, by their input, and the servers profiles
/// were engaged with.
#[derive(Debug, Default)]
pub(crate) struct Steering {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The server each profile was engaged with.
    engaged: HashMap<ProfileKey, String>,
    /// Per input, the profiles handing it and the server each names.
    by_input: HashMap<String, BTreeMap<ProfileKey, String>>,
    /// The input each profile handed when last looked at.
    input_of: HashMap<ProfileKey, String>,
}

impl Steering {
    /// Looks at `profile` handing `input` (if any) to an unbound provider
    /// and naming `server`: records it, and says why it is refused, if it
    /// is.
    pub(crate) fn check(
        &self,
        profile: &str,
        input: Option<&str>,
        server: &str,
    ) -> Result<(), String> {
        let mut state = crate::lock(&self.state);
        state.leave_input(profile);
        if let Some(input) = input {
            state
                .by_input
                .entry(input.to_string())
                .or_default()
                .insert(profile.to_string(), server.to_string());
            state
                .input_of
                .insert(profile.to_string(), input.to_string());
        }
        if let Some(engaged) = state.engaged.get(profile)
            && engaged != server
        {
            return Err(
                "its access provider is bound to no servers and the profile now names a server other than the one it was engaged with; the cluster keeps the engaged one (bind the provider with servers in the provider file, or create the profile again)"
                    .to_string(),
            );
        }
        let Some(input) = input else {
            return Ok(());
        };
        let engaged_with =
            |other: &str, at: &str| state.engaged.get(other).is_some_and(|held| held == at);
        let sharing = state.by_input.get(input).into_iter().flatten();
        let mut established = false;
        let mut conflict = None;
        for (other, other_server) in sharing {
            if other_server == server {
                established |= engaged_with(other, server);
            } else if engaged_with(other, other_server) {
                conflict = Some((other, true));
                break;
            } else {
                conflict = conflict.or(Some((other, false)));
            }
        }
        match conflict {
            // The input was engaged with this server, and only the
            // profiles not engaged name another: they are refused.
            None => Ok(()),
            Some((_, false)) if established => Ok(()),
            Some((other, engaged)) => Err(format!(
                "it hands its access provider's plugin the same input as ClusterProfile {other}, which names another server{}; an access provider bound to no servers sends one input's credentials to one server only (bind it with servers in the provider file)",
                if engaged {
                    " and is engaged with it"
                } else {
                    ""
                }
            )),
        }
    }

    /// `profile` was engaged with `server`.
    pub(crate) fn engaged(&self, profile: &str, server: &str) {
        crate::lock(&self.state)
            .engaged
            .insert(profile.to_string(), server.to_string());
    }

    /// `profile` is gone, or bound: forgets it.
    pub(crate) fn forget(&self, profile: &str) {
        let mut state = crate::lock(&self.state);
        state.engaged.remove(profile);
        state.leave_input(profile);
    }

    /// The other profiles handing the same input as `profile`: a change of
    /// one may lift another's refusal.
    pub(crate) fn sharing_input(&self, profile: &str) -> Vec<ProfileKey> {
        let state = crate::lock(&self.state);
        let Some(input) = state.input_of.get(profile) else {
            return Vec::new();
        };
        state.by_input[input]
            .keys()
            .filter(|other| other.as_str() != profile)
            .cloned()
            .collect()
    }
}

impl State {
    fn leave_input(&mut self, profile: &str) {
        if let Some(input) = self.input_of.remove(profile)
            && let Some(profiles) = self.by_input.get_mut(&input)
        {
            profiles.remove(profile);
            if profiles.is_empty() {
                self.by_input.remove(&input);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engaged_profile_keeps_its_server() {
        let steering = Steering::default();
        steering.check("ns/a", None, "https://a").expect("first");
        steering.engaged("ns/a", "https://a");
        let refused = steering
            .check("ns/a", None, "https://stranger")
            .expect_err("moved");
        assert!(
            refused.contains("other than the one it was engaged with"),
            "{refused}"
        );
        steering.check("ns/a", None, "https://a").expect("back");
        steering.forget("ns/a");
        steering
            .check("ns/a", None, "https://stranger")
            .expect("made again");
    }

    #[test]
    fn one_input_goes_to_one_server_and_the_engaged_profile_keeps_it() {
        let steering = Steering::default();
        let input = Some(r#"{"input":{"config":{"cluster":"a"}},"provider":"p"}"#);
        steering.check("ns/a", input, "https://a").expect("alone");
        steering.engaged("ns/a", "https://a");
        // A copy of a's input naming another server: refused.
        let refused = steering
            .check("ns/thief", input, "https://stranger")
            .expect_err("copy");
        assert!(refused.contains("ClusterProfile ns/a"), "{refused}");
        assert!(refused.contains("is engaged with it"), "{refused}");
        // a itself stays, and one naming a's server is no threat.
        steering
            .check("ns/a", input, "https://a")
            .expect("the engaged one");
        steering
            .check("ns/twin", input, "https://a")
            .expect("same server");
        assert_eq!(steering.sharing_input("ns/a"), ["ns/thief", "ns/twin"]);

        // Neither engaged (a restart): both refused until one goes.
        let restarted = Steering::default();
        restarted
            .check("ns/a", input, "https://a")
            .expect("alone yet");
        assert!(
            restarted
                .check("ns/thief", input, "https://stranger")
                .is_err()
        );
        assert!(restarted.check("ns/a", input, "https://a").is_err());
        restarted.forget("ns/thief");
        restarted
            .check("ns/a", input, "https://a")
            .expect("alone again");
    }
}
