//! Which extender replica writes profiles: the holder of a `coordination.k8s.io` Lease of its
//! own. kube-scheduler's election says which scheduler schedules, but the extender beside it is
//! not told, and the profiles need one writer whichever scheduler leads (two writers would fold
//! the same observations twice into `gpuHours` and race on every write).
//!
//! The protocol is client-go's: take the Lease when nobody holds it or its holder has not renewed
//! it within its duration; renew it while holding it. A write goes through the Lease's
//! `resourceVersion`, so of two replicas racing for an expired Lease exactly one wins.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};

/// The Lease's name (in `--profile-lease-namespace`), as the chart's RBAC names it.
pub const LEASE_NAME: &str = "peakfit-profiles";

/// One replica's claim on the profile Lease.
pub struct ProfileLease {
    api: Api<Lease>,
    identity: String,
    duration: Duration,
}

impl ProfileLease {
    pub fn new(api: Api<Lease>, identity: String, duration: Duration) -> Self {
        Self {
            api,
            identity,
            duration,
        }
    }

    /// Takes or renews the Lease; whether this replica holds it now. An API error is "not the
    /// leader" for this round (the caller tries again next round).
    pub async fn try_hold(&self) -> bool {
        match self.try_hold_inner().await {
            Ok(held) => held,
            Err(e) => {
                tracing::debug!(error = %e, "profile lease not taken this round");
                false
            }
        }
    }

    async fn try_hold_inner(&self) -> Result<bool, kube::Error> {
        let now = jiff::Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(LEASE_NAME).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        if !mine && !expired(spec, now) {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(seconds);
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            // Someone else wrote it since we read it: theirs this round.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Whether the holder let the Lease lapse (or nobody holds it).
fn expired(spec: &LeaseSpec, now: jiff::Timestamp) -> bool {
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return true;
    }
    let Some(renew) = &spec.renew_time else {
        return true;
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    now.as_second() > renew.0.as_second().saturating_add(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lapses_after_its_duration_without_renewal() {
        let at = |s: i64| jiff::Timestamp::from_second(s).unwrap();
        let spec = LeaseSpec {
            holder_identity: Some("a".into()),
            renew_time: Some(MicroTime(at(1_000))),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        assert!(!expired(&spec, at(1_015)));
        assert!(expired(&spec, at(1_016)));
        assert!(expired(&LeaseSpec::default(), at(0)));
    }
}
