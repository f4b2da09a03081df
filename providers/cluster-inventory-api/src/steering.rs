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

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// A profile, `<namespace>/<name>`.
pub(crate) type ProfileKey = String;

/// What a profile handed an unbound provider's plugin and where it sent
/// the credential.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Call {
    input: Option<String>,
    server: String,
}

/// The unbound profiles seen, what each was engaged with, and an index of
/// both by input.
#[derive(Debug, Default)]
pub(crate) struct Steering {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// What each profile asks for now.
    current: HashMap<ProfileKey, Call>,
    /// What each profile was engaged with: its server, and its input,
    /// whose credential went to that server.
    engaged: HashMap<ProfileKey, Call>,
    /// Per input, the profiles asking for it now or engaged with it.
    by_input: HashMap<String, BTreeSet<ProfileKey>>,
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
        let call = Call {
            input: input.map(str::to_string),
            server: server.to_string(),
        };
        state.set_current(profile, call);
        if let Some(engaged) = state.engaged.get(profile)
            && engaged.server != server
        {
            return Err(
                "its access provider is bound to no servers and the profile now names a server other than the one it was engaged with; the cluster keeps the engaged one (bind the provider with servers in the provider file, or create the profile again)"
                    .to_string(),
            );
        }
        let Some(input) = input else {
            return Ok(());
        };
        fn handed<'a>(call: Option<&'a Call>, input: &str) -> Option<&'a str> {
            call.filter(|call| call.input.as_deref() == Some(input))
                .map(|call| call.server.as_str())
        }
        // The input was engaged with this server (by this profile or
        // another): only profiles naming another server are refused.
        let mut established = handed(state.engaged.get(profile), input) == Some(server);
        let mut waiting = None;
        for other in state.by_input.get(input).into_iter().flatten() {
            if other == profile {
                continue;
            }
            match handed(state.engaged.get(other), input) {
                Some(at) if at == server => established = true,
                Some(_) => return Err(sharing(other, true)),
                None => {}
            }
            if handed(state.current.get(other), input).is_some_and(|at| at != server) {
                waiting = waiting.or(Some(other));
            }
        }
        match waiting {
            Some(other) if !established => Err(sharing(other, false)),
            _ => Ok(()),
        }
    }

    /// `profile` was engaged with what it asked for last.
    pub(crate) fn engaged(&self, profile: &str) {
        let mut state = crate::lock(&self.state);
        let Some(call) = state.current.get(profile).cloned() else {
            return;
        };
        if let Some(before) = state.engaged.insert(profile.to_string(), call.clone()) {
            state.unindex(profile, before.input.as_deref());
        }
        state.index(profile, call.input.as_deref());
    }

    /// `profile` is gone, or its provider bound: forgets it.
    pub(crate) fn forget(&self, profile: &str) {
        let mut state = crate::lock(&self.state);
        for call in [state.current.remove(profile), state.engaged.remove(profile)]
            .into_iter()
            .flatten()
        {
            state.unindex(profile, call.input.as_deref());
        }
    }

    /// The other profiles asking for, or engaged with, the input `profile`
    /// asks for or was engaged with: a change of one may lift another's
    /// refusal.
    pub(crate) fn sharing_input(&self, profile: &str) -> Vec<ProfileKey> {
        let state = crate::lock(&self.state);
        let inputs = [state.current.get(profile), state.engaged.get(profile)]
            .into_iter()
            .flatten()
            .filter_map(|call| call.input.as_deref());
        let mut others = BTreeSet::new();
        for input in inputs {
            others.extend(
                state.by_input[input]
                    .iter()
                    .filter(|other| other.as_str() != profile)
                    .cloned(),
            );
        }
        others.into_iter().collect()
    }
}

fn sharing(other: &str, engaged: bool) -> String {
    format!(
        "it hands its access provider's plugin the same input as ClusterProfile {other}, which {} another server; an access provider bound to no servers sends one input's credentials to one server only (bind it with servers in the provider file)",
        if engaged { "was engaged with" } else { "names" }
    )
}

impl State {
    fn set_current(&mut self, profile: &str, call: Call) {
        let input = call.input.clone();
        if let Some(before) = self.current.insert(profile.to_string(), call) {
            self.unindex(profile, before.input.as_deref());
        }
        self.index(profile, input.as_deref());
    }

    fn index(&mut self, profile: &str, input: Option<&str>) {
        if let Some(input) = input {
            self.by_input
                .entry(input.to_string())
                .or_default()
                .insert(profile.to_string());
        }
    }

    /// Drops `profile` from `input`'s profiles unless it still asks for it
    /// or was engaged with it.
    fn unindex(&mut self, profile: &str, input: Option<&str>) {
        let Some(input) = input else {
            return;
        };
        let still = [self.current.get(profile), self.engaged.get(profile)]
            .into_iter()
            .flatten()
            .any(|call| call.input.as_deref() == Some(input));
        if still {
            return;
        }
        if let Some(profiles) = self.by_input.get_mut(input) {
            profiles.remove(profile);
            if profiles.is_empty() {
                self.by_input.remove(input);
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
        steering.engaged("ns/a");
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
        steering.engaged("ns/a");
        // A copy of a's input naming another server: refused.
        let refused = steering
            .check("ns/thief", input, "https://stranger")
            .expect_err("copy");
        assert!(refused.contains("ClusterProfile ns/a"), "{refused}");
        assert!(
            refused.contains("was engaged with another server"),
            "{refused}"
        );
        // a moved to the thief's server, or handing another input now:
        // the input stays with the server it was engaged with.
        assert!(steering.check("ns/a", input, "https://stranger").is_err());
        assert!(
            steering
                .check("ns/thief", input, "https://stranger")
                .is_err()
        );
        steering
            .check("ns/a", Some("other"), "https://a")
            .expect("a's own change");
        assert!(
            steering
                .check("ns/thief", input, "https://stranger")
                .is_err()
        );
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
