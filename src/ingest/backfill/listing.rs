//! Listings: which repositories exist. A relay's `listHosts` names hosts; each host's `listRepos`
//! names DIDs. Every entry is a hint (the repository is fetched from its own PDS, `fetch`), so a
//! listing only ever adds pending rows to repos.db.
//!
//! Invariants:
//! - Hosts are paged interleaved: at most `listing_concurrency` pages in flight, at most one per
//!   host, and a host goes to the back of the queue after each page, so a slow or endless host
//!   holds one slot at a time and the others keep moving.
//! - A host's listing ends at `max_pages_per_host` pages or `max_dids_per_host` entries (the cut is
//!   logged and counted), when its breaker pauses it, or when a page keeps failing; its cursor and
//!   counts are saved after every page, so a restart resumes with the caps already spent.
//! - A relay's host list is bounded by the same caps.

use super::repos::{Listed, Listing};
use super::xrpc;
use super::{Backfill, BackfillError, Source};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::task::JoinSet;

/// What became of one page of a host's listing.
enum PageOutcome {
    More,
    Finished,
}

impl Backfill {
    /// Lists every network source into repos.db, then says so.
    pub(super) async fn list_all(self: &Arc<Self>, sources: Vec<Source>) {
        let mut hosts = Vec::new();
        for source in sources {
            match source {
                Source::Repo(did) => {
                    if let Err(e) = self.offer(&[Listed { did: &did, host: "direct", rev: None, inactive: None }]) {
                        tracing::error!(did, error = %e, "could not record the repository");
                    }
                }
                Source::Pds(url) => hosts.push(xrpc::base_url(&url, "https")),
                Source::Relay(url) => hosts.extend(self.relay_hosts(&url).await),
                Source::Car(_) => {}
            }
        }
        self.list_hosts_interleaved(hosts).await;
        self.listings_done.store(true, Ordering::Release);
        self.listing_news.notify_one();
    }

    pub(super) fn offer(&self, listed: &[Listed<'_>]) -> Result<(), BackfillError> {
        self.repos.offer(listed, self.now_ms())?;
        self.count_known()?;
        self.listing_news.notify_one();
        Ok(())
    }

    /// Pages through every host's `listRepos`, a page each in turn.
    async fn list_hosts_interleaved(self: &Arc<Self>, hosts: Vec<String>) {
        let mut seen = HashSet::new();
        let mut queue: VecDeque<String> = hosts.into_iter().filter(|host| seen.insert(host.clone())).collect();
        let mut pages: JoinSet<(String, Result<PageOutcome, BackfillError>)> = JoinSet::new();
        loop {
            while pages.len() < self.options.listing_concurrency.max(1)
                && let Some(host) = queue.pop_front()
            {
                let this = self.clone();
                pages.spawn(async move {
                    let outcome = this.list_page(&host).await;
                    (host, outcome)
                });
            }
            let Some(done) = pages.join_next().await else { return };
            match done {
                Ok((host, Ok(PageOutcome::More))) => queue.push_back(host),
                Ok((_, Ok(PageOutcome::Finished))) => {}
                Ok((host, Err(e))) => {
                    tracing::error!(host, error = %e, "listing failed; repositories listed so far are still fetched")
                }
                Err(e) => tracing::error!(error = %e, "a listing task failed"),
            }
        }
    }

    /// One page of `listRepos` on `base`, from its saved cursor, within its caps.
    async fn list_page(&self, base: &str) -> Result<PageOutcome, BackfillError> {
        let source = format!("listRepos {base}");
        let mut listing = self.repos.listing(&source)?;
        if listing.complete {
            return Ok(PageOutcome::Finished);
        }
        if self.over_caps(base, &listing) {
            listing.complete = true;
            self.repos.set_listing(&source, &listing)?;
            return Ok(PageOutcome::Finished);
        }
        let page = self
            .with_retries(base, || {
                xrpc::list_repos(&self.http, base, listing.cursor.as_deref(), self.options.listing_timeout)
            })
            .await;
        let page = match page {
            Ok(page) => page,
            Err(failure) => {
                tracing::warn!(host = base, error = %failure, "listRepos failed; host skipped this run");
                return Ok(PageOutcome::Finished);
            }
        };
        self.progress.invalid_listed.fetch_add(page.invalid as u64, Ordering::Relaxed);
        let room = self.options.max_dids_per_host.saturating_sub(listing.dids) as usize;
        let listed: Vec<Listed<'_>> = page
            .items
            .iter()
            .take(room)
            .map(|r| Listed { did: &r.did, host: base, rev: r.rev, inactive: r.inactive })
            .collect();
        self.offer(&listed)?;
        listing.pages += 1;
        listing.dids += listed.len() as u64;
        listing.complete = page.next.is_none();
        listing.cursor = page.next;
        self.repos.set_listing(&source, &listing)?;
        Ok(if listing.complete { PageOutcome::Finished } else { PageOutcome::More })
    }

    /// Whether `host`'s listing has given all it may; says so once when it has.
    fn over_caps(&self, host: &str, listing: &Listing) -> bool {
        let over = listing.pages >= self.options.max_pages_per_host || listing.dids >= self.options.max_dids_per_host;
        if over {
            self.progress.listings_capped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                host,
                pages = listing.pages,
                dids = listing.dids,
                "listing cut off: the host gave more pages or entries than a host may"
            );
        }
        over
    }

    /// The hosts a relay's `listHosts` names (every run: it is short), within the caps.
    async fn relay_hosts(&self, relay: &str) -> Vec<String> {
        let relay = xrpc::base_url(relay, "https");
        // Hosts are bare hostnames; they are reached the way the relay itself was (https in
        // production, plain http only when the relay was given as http://, as in local tests).
        let scheme = if relay.starts_with("http://") { "http" } else { "https" };
        let (mut hosts, mut cursor, mut pages) = (Vec::new(), None::<String>, 0u64);
        loop {
            let listing = Listing { pages, dids: hosts.len() as u64, ..Listing::default() };
            if self.over_caps(&relay, &listing) {
                return hosts;
            }
            let page = self
                .with_retries(&relay, || {
                    xrpc::list_hosts(&self.http, &relay, cursor.as_deref(), self.options.listing_timeout)
                })
                .await;
            let page = match page {
                Ok(page) => page,
                Err(failure) => {
                    tracing::error!(relay, error = %failure, "listHosts failed; the hosts listed so far are listed");
                    return hosts;
                }
            };
            pages += 1;
            hosts.extend(page.items.iter().map(|host| xrpc::base_url(host, scheme)));
            match page.next {
                Some(next) => cursor = Some(next),
                None => return hosts,
            }
        }
    }
}
