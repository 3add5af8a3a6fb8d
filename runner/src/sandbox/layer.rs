//! A profile file as a layer: what one file sets ([`Layer`], checked by
//! [`super::profile::RawProfile::layer`]), laid over the profile it `extends`
//! ([`Layer::onto`]) — values replace the parent's, lists add to them — and the `[network]`
//! table that makes an allow-list.

use std::collections::BTreeMap;

use toml::Spanned;

use super::profile::{Checker, Limits, Network, Profile, ProfileError, RawNetworkTable, RunAs};
use crate::egress::policy::{Policy, Rule};

/// How a profile changes the network of the one it extends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NetworkLayer {
    Mode(Network),
    AllowList(Policy),
}

/// One profile file, checked: what it sets, before it is laid over the profile it extends
/// (see [`Layer::onto`]).
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    /// The profile it extends, with the line that says so.
    pub extends: Option<(String, usize)>,
    pub(super) description: Option<String>,
    pub(super) best_effort: Option<bool>,
    pub(super) run_as: Option<RunAs>,
    pub(super) readable: Vec<String>,
    pub(super) executable: Vec<String>,
    pub(super) writable: Vec<String>,
    pub(super) protected: Vec<String>,
    pub(super) network: Option<NetworkLayer>,
    pub(super) limits: Limits,
    pub(super) env_allow: Vec<String>,
    pub(super) env_set: Vec<(String, String)>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) kill_grace_ms: Option<u64>,
    pub(super) caches: Vec<(String, String)>,
}

impl Checker<'_> {
    /// A `[network]` table: every rule parsed, every static name a host name with an address.
    pub(super) fn network_table(
        &self,
        span: std::ops::Range<usize>,
        t: &RawNetworkTable,
    ) -> Result<Policy, ProfileError> {
        let rules = |field: &str, list: &[Spanned<String>]| -> Result<Vec<Rule>, ProfileError> {
            list.iter()
                .map(|r| Rule::parse(r.get_ref()).map_err(|m| self.err(r.span(), field, m)))
                .collect()
        };
        let allow = rules("network.allow", &t.allow)?;
        let deny = rules("network.deny", &t.deny)?;
        let mut hosts = BTreeMap::new();
        for (name, addr) in &t.hosts {
            let field = format!("network.hosts.{name}");
            let name = match crate::egress::policy::normalize(name) {
                Ok(crate::egress::policy::Host::Name(n)) => n,
                _ => return Err(self.err(addr.span(), &field, "not a host name")),
            };
            let ip = addr.get_ref().parse().map_err(|_| {
                self.err(
                    addr.span(),
                    &field,
                    format!("{:?}: expected an IPv4 or IPv6 address", addr.get_ref()),
                )
            })?;
            hosts.insert(name, ip);
        }
        if allow.is_empty() && deny.is_empty() && hosts.is_empty() {
            return Err(self.err(
                span,
                "network",
                "an empty [network] table; list hosts in allow, or use network = \"none\"",
            ));
        }
        Ok(Policy { allow, deny, hosts })
    }
}

fn push_new(list: &mut Vec<String>, items: Vec<String>) {
    for i in items {
        if !list.contains(&i) {
            list.push(i);
        }
    }
}

impl Layer {
    /// Lays this file over `base` (the profile it extends, or [`Profile::empty`]): what it
    /// sets replaces the base's, and its lists (paths, protected paths, passed variables,
    /// allow and deny rules, caches) are added to the base's. A profile narrows what it
    /// inherits by setting lower limits, `network = "none"`, or deny rules.
    pub(crate) fn onto(self, base: Profile, name: &str) -> Profile {
        let mut p = base;
        p.name = name.into();
        p.extends = self.extends.map(|(n, _)| n);
        if let Some(d) = self.description {
            p.description = d;
        }
        if let Some(b) = self.best_effort {
            p.best_effort = b;
        }
        if let Some(r) = self.run_as {
            p.run_as = r;
        }
        push_new(&mut p.readable, self.readable);
        push_new(&mut p.executable, self.executable);
        push_new(&mut p.writable, self.writable);
        push_new(&mut p.protected, self.protected);
        match self.network {
            None => {}
            Some(NetworkLayer::Mode(m)) => {
                p.network = m;
                p.egress = None;
            }
            Some(NetworkLayer::AllowList(policy)) => {
                p.network = Network::Loopback;
                match &mut p.egress {
                    Some(base) => base.extend(&policy),
                    None => p.egress = Some(policy),
                }
            }
        }
        let (l, b) = (self.limits, p.limits);
        p.limits = Limits {
            memory: l.memory.or(b.memory),
            pids: l.pids.or(b.pids),
            cpu_millicores: l.cpu_millicores.or(b.cpu_millicores),
            cpu_time_s: l.cpu_time_s.or(b.cpu_time_s),
            open_files: l.open_files.or(b.open_files),
            file_size: l.file_size.or(b.file_size),
            output: l.output.or(b.output),
        };
        push_new(&mut p.env_allow, self.env_allow);
        for (k, v) in self.env_set {
            p.env_set.retain(|(name, _)| *name != k);
            p.env_set.push((k, v));
        }
        p.timeout_ms = self.timeout_ms.or(p.timeout_ms);
        p.kill_grace_ms = self.kill_grace_ms.or(p.kill_grace_ms);
        for (n, at) in self.caches {
            p.caches.retain(|(name, _)| *name != n);
            p.caches.push((n, at));
        }
        // Executable and writable paths must also be visible: fold them into readable.
        let mut more = p.executable.clone();
        more.extend(p.writable.iter().cloned());
        push_new(&mut p.readable, more);
        p
    }
}
