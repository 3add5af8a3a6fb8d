//! Concurrency bounds: each session has a lane, its slots and a queue of calls waiting for
//! one, served in submission order by one task per session; slots are also bounded globally.

use super::*;

/// A session's slots and its queue of calls waiting for one.
#[derive(Clone)]
pub(super) struct Lane {
    slots: Arc<Semaphore>,
    /// The session owner's slots, shared by all their sessions (`per_user.running`).
    user: Arc<Semaphore>,
    queue: mpsc::UnboundedSender<Queued>,
    waiting: Arc<AtomicUsize>,
}

/// The slots a run holds until it settles: the daemon's, its owner's and its session's.
pub(super) struct Slots(#[allow(dead_code)] [OwnedSemaphorePermit; 3]);

/// A call waiting for a slot.
pub(super) struct Queued {
    live: Arc<Live>,
    stdin: Option<OwnedFd>,
}

impl Executor {
    /// Starts a call now if its session and the daemon have a free slot and nobody is
    /// waiting before it; otherwise queues it.
    pub(super) fn start_or_queue(self: &Arc<Self>, live: Arc<Live>, stdin: Option<OwnedFd>) {
        let lane = self.lane(&live.session_id, live.owner_uid);
        let permits = (lane.waiting.load(Ordering::SeqCst) == 0)
            .then(|| self.try_slots(&live.session_id, live.owner_uid))
            .flatten();
        match permits {
            Some(permits) => self.start_and_watch(live, stdin, permits),
            None => self.enqueue(live, stdin),
        }
    }

    /// The session's lane: its slots and the queue of calls waiting for one, served in
    /// submission order by one task per session. `owner` is the session's owner.
    pub(super) fn lane(self: &Arc<Self>, session_id: &str, owner: u32) -> Lane {
        let mut map = self.per_session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lane) = map.get(session_id) {
            return lane.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let lane = Lane {
            slots: Arc::new(Semaphore::new(self.cfg.max_running_per_session.max(1))),
            user: self.user_slots(owner),
            queue: tx,
            waiting: Arc::new(AtomicUsize::new(0)),
        };
        map.insert(session_id.to_owned(), lane.clone());
        tokio::spawn(self.clone().serve_lane(lane.clone(), rx));
        lane
    }

    /// Forgets a closed session's lane: its queue task ends once the calls already in it are
    /// served (they were canceled with the session). A session opened again gets a new one.
    pub(crate) fn forget_session(&self, session_id: &str) {
        self.per_session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id);
        self.polling.forget(session_id);
    }

    /// A user's run slots (`per_user.running`), shared by all their sessions.
    fn user_slots(&self, uid: u32) -> Arc<Semaphore> {
        let mut map = self.per_user.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(uid)
            .or_insert_with(|| Arc::new(Semaphore::new(self.cfg.per_user.running.max(1))))
            .clone()
    }

    /// Queues a call until its session and the daemon have a free slot.
    pub(super) fn enqueue(self: &Arc<Self>, live: Arc<Live>, stdin: Option<OwnedFd>) {
        let lane = self.lane(&live.session_id, live.owner_uid);
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
            // Session, then user, then the daemon's: a call that waits for its user's slot
            // holds no global one, so it delays no other user.
            let session = lane.slots.clone().acquire_owned().await;
            let user = lane.user.clone().acquire_owned().await;
            let global = self.global.clone().acquire_owned().await;
            lane.waiting.fetch_sub(1, Ordering::SeqCst);
            let (Ok(session), Ok(user), Ok(global)) = (session, user, global) else {
                return;
            };
            self.start_and_watch(q.live, q.stdin, Slots([global, user, session]));
        }
    }

    /// Starts the run now and watches it in the background, holding its slots until it settles.
    pub(super) fn start_and_watch(
        self: &Arc<Self>,
        live: Arc<Live>,
        stdin: Option<OwnedFd>,
        permits: Slots,
    ) {
        if let Some(watched) = self.start(&live, stdin) {
            let this = self.clone();
            tokio::spawn(async move {
                this.watch(live, watched).await;
                drop(permits);
            });
        }
    }

    /// A run's slots now, if the daemon, its owner and its session all have one free.
    pub(super) fn try_slots(self: &Arc<Self>, session_id: &str, owner: u32) -> Option<Slots> {
        let lane = self.lane(session_id, owner);
        let global = self.global.clone().try_acquire_owned().ok()?;
        let user = lane.user.try_acquire_owned().ok()?;
        let session = lane.slots.try_acquire_owned().ok()?;
        Some(Slots([global, user, session]))
    }
}
