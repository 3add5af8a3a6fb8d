//! Concurrency bounds: each session has a lane, its slots and a queue of calls waiting for
//! one, served in submission order by one task per session; slots are also bounded globally.

use super::*;

/// A session's slots and its queue of calls waiting for one.
#[derive(Clone)]
pub(super) struct Lane {
    slots: Arc<Semaphore>,
    queue: mpsc::UnboundedSender<Queued>,
    waiting: Arc<AtomicUsize>,
}

/// A call waiting for a slot.
pub(super) struct Queued {
    live: Arc<Live>,
    stdin: Option<OwnedFd>,
}

impl Executor {
    /// Starts a call now if its session and the daemon have a free slot and nobody is
    /// waiting before it; otherwise queues it.
    pub(super) fn start_or_queue(self: &Arc<Self>, live: Arc<Live>, stdin: Option<OwnedFd>) {
        let lane = self.lane(&live.session_id);
        let permits = (lane.waiting.load(Ordering::SeqCst) == 0)
            .then(|| self.try_slots(&live.session_id))
            .flatten();
        match permits {
            Some(permits) => self.start_and_watch(live, stdin, permits),
            None => self.enqueue(live, stdin),
        }
    }

    /// The session's lane: its slots and the queue of calls waiting for one, served in
    /// submission order by one task per session.
    pub(super) fn lane(self: &Arc<Self>, session_id: &str) -> Lane {
        let mut map = self.per_session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lane) = map.get(session_id) {
            return lane.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let lane = Lane {
            slots: Arc::new(Semaphore::new(self.cfg.max_running_per_session.max(1))),
            queue: tx,
            waiting: Arc::new(AtomicUsize::new(0)),
        };
        map.insert(session_id.to_owned(), lane.clone());
        tokio::spawn(self.clone().serve_lane(lane.clone(), rx));
        lane
    }

    pub(super) fn session_slots(self: &Arc<Self>, session_id: &str) -> Arc<Semaphore> {
        self.lane(session_id).slots
    }

    /// Queues a call until its session and the daemon have a free slot.
    pub(super) fn enqueue(self: &Arc<Self>, live: Arc<Live>, stdin: Option<OwnedFd>) {
        let lane = self.lane(&live.session_id);
        lane.waiting.fetch_add(1, Ordering::SeqCst);
        if lane.queue.send(Queued { live, stdin }).is_err() {
            lane.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Starts queued calls in order as slots free up.
    pub(super) async fn serve_lane(
        self: Arc<Self>,
        lane: Lane,
        mut rx: mpsc::UnboundedReceiver<Queued>,
    ) {
        while let Some(q) = rx.recv().await {
            if q.live.lock().settled {
                lane.waiting.fetch_sub(1, Ordering::SeqCst);
                continue; // canceled while queued
            }
            let session = lane.slots.clone().acquire_owned().await;
            let global = self.global.clone().acquire_owned().await;
            lane.waiting.fetch_sub(1, Ordering::SeqCst);
            let (Ok(session), Ok(global)) = (session, global) else {
                return;
            };
            self.start_and_watch(q.live, q.stdin, (global, session));
        }
    }

    /// Starts the run now and watches it in the background, holding its slots until it settles.
    pub(super) fn start_and_watch(
        self: &Arc<Self>,
        live: Arc<Live>,
        stdin: Option<OwnedFd>,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) {
        if let Some((child, pidfd)) = self.start(&live, stdin) {
            let this = self.clone();
            tokio::spawn(async move {
                this.watch(live, pidfd, Some(child)).await;
                drop(permits);
            });
        }
    }

    pub(super) fn try_slots(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let global = self.global.clone().try_acquire_owned().ok()?;
        let session = self.session_slots(session_id).try_acquire_owned().ok()?;
        Some((global, session))
    }
}
