//! Submission: a call becomes a recorded task with a launch plan, started at once or queued
//! in its session's lane (docs/protocol.md, `tool.call`). Three steps: plan (the tool's plan
//! and the run's sandbox, nothing on disk yet), stage (the run's directories, sockets and
//! launch plan), go live (the task's row, its live entry, its start).

use super::*;
use crate::plugin_host::ToolPlan;
use crate::protocol::TaskMode;
use crate::run::plan::Stderr;
use crate::sandbox::call::CallSandbox;

fn io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExecError {
    let path = path.to_path_buf();
    move |source| ExecError::Io { step, path, source }
}

/// Daemon configuration handed to plugins as `context.config`.
fn plugin_config(cfg: &Config) -> serde_json::Value {
    serde_json::json!({ "subagent": cfg.subagent })
}

/// A run whose directories and launch plan are written, not yet recorded.
struct Staged {
    public: OwnedFd,
    public_path: PathBuf,
    profile: String,
    run_as: (Option<u32>, Option<u32>),
    egress: Option<egress::Bound>,
    extras: RunExtras,
    service: bool,
    summary: String,
    /// The shared offline network namespace the run may join (network off only).
    netns_key: Option<String>,
}

impl Executor {
    /// Records the task, writes its launch plan and starts driving it. With `foreground`, the
    /// returned receiver hears how it ends (or that it was moved to the background).
    pub(crate) fn submit(
        self: &Arc<Self>,
        req: CallRequest,
        foreground: bool,
    ) -> Result<(TaskRow, Option<oneshot::Receiver<FgEvent>>), ExecError> {
        let task_id = ids::ulid();
        let private = self.runs.new_private(&task_id);
        let (tool_plan, sb) = self.plan_call(&req, &task_id, &private)?;
        let path = private.path().to_path_buf();
        let private = self
            .runs
            .create(private, &task_id)
            .map_err(io("create the run's private directory", &path))?;
        let staged = self
            .stage(&req, &task_id, &private, tool_plan, sb)
            .inspect_err(|_| private.remove())?;
        self.go_live(req, foreground, task_id, private, staged)
    }

    /// The tool's plan for the call, and the sandbox its run gets: the ceiling (the session's
    /// profile, or the narrower one of the run that made this call), or the narrower one the
    /// call (or the tool) names, resolved for this run.
    fn plan_call(
        &self,
        req: &CallRequest,
        task_id: &str,
        private: &PrivateDir,
    ) -> Result<(ToolPlan, CallSandbox), ExecError> {
        let tool = self.tools.get(&req.tool).ok_or_else(|| {
            ExecError::InvalidParams(format!(
                "unknown tool {:?}; tool.list names the tools there are",
                req.tool
            ))
        })?;
        self.check_shares(&req.session)?;
        let workspace = PathBuf::from(&req.session.workspace);
        let session_dir = PathBuf::from(&req.session.session_dir);
        let ceiling = req
            .ceiling
            .clone()
            .unwrap_or_else(|| req.session.profile.clone());
        let plugin_config = plugin_config(&self.cfg);
        let ctx = PlanContext {
            workspace: &workspace,
            session_id: &req.session.session_id,
            task_id,
            session_dir: &session_dir,
            tmp_dir: &private.files(),
            profile: &ceiling,
            depth: crate::session::depth_of(&self.registry, &req.session),
            config: &plugin_config,
        };
        let tool_plan = tool
            .plan(&req.args, &ctx)
            .map_err(|e| ExecError::InvalidParams(e.0))?;
        let (grants, plan_profile) = self.agent_grants(req, &tool_plan, &ceiling)?;
        let caller_grants = self.caller_grants(req)?;
        let sb = sandbox::call::for_call(
            &self.catalog,
            &ceiling,
            req.profile.as_deref().or(plan_profile.as_deref()),
            &sandbox::call::CallFor {
                workspace: &workspace,
                session_dir: &session_dir,
                owner: (req.session.owner_uid, req.session.owner_gid),
                state_dir: &self.cfg.state_dir,
                grants: grants.as_ref(),
                caller_grants: caller_grants.as_ref(),
            },
        )
        .map_err(|e| match e {
            sandbox::call::CallSandboxError::Invalid(m) => ExecError::InvalidParams(m),
            sandbox::call::CallSandboxError::Unavailable(m) => ExecError::SandboxUnavailable(m),
        })?;
        Ok((tool_plan, sb))
    }

    /// The `[subagent]` grants (the agent's configuration and model API hosts), which go to
    /// the subagent tool's own run, never to what it starts; and the profile the plan names.
    /// The agent's profile (`[subagent] profile`) applies when it narrows the caller's; a
    /// caller under something narrower keeps its own profile for the agent, with the grants,
    /// as before there was an agent profile.
    fn agent_grants(
        &self,
        req: &CallRequest,
        tool_plan: &ToolPlan,
        ceiling: &str,
    ) -> Result<(Option<sandbox::call::Grants>, Option<String>), ExecError> {
        if !(req.tool == "subagent" && tool_plan.child_session) {
            return Ok((None, tool_plan.profile.clone()));
        }
        let grants = self.cfg.subagent.grants().map_err(|e| {
            ExecError::InvalidParams(format!("[subagent] in the daemon's config: {e}"))
        })?;
        let profile = match tool_plan.profile.as_deref() {
            Some(agent) if req.profile.is_none() => {
                match sandbox::call::narrows(&self.catalog, agent, ceiling, req.session.owner_uid) {
                    Ok(true) => Some(agent.to_owned()),
                    Ok(false) => {
                        info!(profile = agent, ceiling = %ceiling, "the subagent profile is wider than the caller's; the agent runs under the caller's");
                        None
                    }
                    Err(e) => {
                        return Err(ExecError::InvalidParams(format!(
                            "[subagent] profile {agent:?}: {e}"
                        )))
                    }
                }
            }
            p => p.map(str::to_owned),
        };
        Ok((Some(grants), profile))
    }

    /// Makes the run's public directory, binds its sockets (egress proxy; the hooks' bridge),
    /// writes the plan's files and the launch plan.
    fn stage(
        &self,
        req: &CallRequest,
        task_id: &str,
        private: &PrivateDir,
        tool_plan: ToolPlan,
        mut sb: CallSandbox,
    ) -> Result<Staged, ExecError> {
        let owner = (req.session.owner_uid, req.session.owner_gid);
        let session_dir = Path::new(&req.session.session_dir);
        let public_path = PathBuf::from(crate::run::dir::public_path(
            &req.session.session_dir,
            task_id,
        ));
        let public = crate::run::dir::create_public(session_dir, owner, task_id)
            .map_err(io("create run directory", &public_path))?;
        // Root runs other users' commands as those users, never as root.
        let run_as = sandbox::call::run_ids(sb.run_as, owner);
        // A run whose network is off shares an empty network namespace with the session's
        // other such runs of the same user (see `supervisor::spawner`).
        // No caller's path may hand the run the control socket or another run's bridge.
        sb.sandbox.off_limits = self.socket_dirs.clone();
        let netns_key = (sb.sandbox.network == sandbox::Network::None).then(|| {
            let uid = run_as.0.unwrap_or_else(sys::getuid);
            format!("{uid}/{}", req.session.session_id)
        });
        // An allow-list run: its proxy socket, bound now and served once the task is live.
        let egress = match &mut sb.sandbox.egress {
            Some(plan) => Some(self.bind_egress(task_id, req.session.owner_uid, private, plan)?),
            None => None,
        };
        let files_dir = plan_files::write(private, &tool_plan, run_as)?;
        // A child session and a bridge, if the plan asks (the hooks: bridge/).
        let extras = self.hooks().prepare(
            self,
            &RunStart {
                task_id,
                session: &req.session,
                profile: &sb.profile,
                run_as,
                plan: &tool_plan,
            },
        )?;
        sb.env.push(("SIDEJOB_TASK_ID".into(), task_id.to_owned()));
        sb.env
            .push(("SIDEJOB_SESSION_ID".into(), req.session.session_id.clone()));
        sb.env.extend(tool_plan.env);
        sb.env.extend(extras.env.iter().cloned());
        let cap = sb.timeout_ms.map_or(self.cfg.detached_cap_ms, |t| {
            t.min(self.cfg.detached_cap_ms)
        });
        let grace = sb.kill_grace_ms.unwrap_or(self.cfg.cancel_grace_ms);
        let max_output = sb.max_output_bytes.map_or(self.cfg.max_output_bytes, |m| {
            m.min(self.cfg.max_output_bytes)
        });
        let profile = sb.profile.clone();
        sb.sandbox = plan_files::mount(files_dir, sb.sandbox);
        let plan = sb
            .plan(
                &req.tool,
                tool_plan.argv,
                tool_plan.cwd,
                private.path().to_path_buf(),
            )
            .task(task_id, &req.session.session_id)
            .public_dir(public_path.clone(), Some(owner))
            .caller(req.owner.clone())
            .run_as(run_as.0, run_as.1)
            .timeout_ms(Some(req.timeout_ms.map_or(cap, |t| t.min(cap))))
            .kill_grace_ms(Some(grace))
            .max_output_bytes(Some(max_output))
            .bridge(extras.bridge_socket.clone())
            .stderr(match req.stderr {
                StderrMode::Merged => Stderr::Merged,
                StderrMode::Separate => Stderr::Separate,
            })
            .build();
        // Read by the supervisor only: compact is quicker to write and to read.
        let plan_bytes =
            serde_json::to_vec(&plan).map_err(|e| ExecError::InvalidParams(e.to_string()))?;
        std::fs::write(private.plan(), plan_bytes)
            .map_err(io("write launch plan", &private.plan()))?;
        Ok(Staged {
            public,
            public_path,
            profile,
            run_as,
            egress,
            extras,
            service: req.service || tool_plan.service,
            summary: tool_plan.summary,
            netns_key,
        })
    }

    /// Records the task, makes it live (its bridge and proxy served from now on) and starts
    /// it when there is a free slot, so it is `running` by the time the call returns;
    /// otherwise it waits as `queued`.
    fn go_live(
        self: &Arc<Self>,
        req: CallRequest,
        foreground: bool,
        task_id: String,
        private: PrivateDir,
        staged: Staged,
    ) -> Result<(TaskRow, Option<oneshot::Receiver<FgEvent>>), ExecError> {
        let Staged {
            public,
            public_path,
            profile,
            run_as,
            egress,
            extras,
            service,
            summary,
            netns_key,
        } = staged;
        let row = TaskRow {
            mode: if foreground {
                TaskMode::Foreground
            } else {
                TaskMode::Background
            },
            public_dir: public_path.display().to_string(),
            service,
            parent_task_id: req.parent_task_id.clone(),
            timeout_ms: req.timeout_ms,
            stdin: req.stdin,
            wake: req.wake,
            occurrence_key: req.occurrence_key.clone(),
            profile,
            run_uid: run_as.0,
            run_gid: run_as.1,
            bridge_session_id: extras.bridge_session_id.clone(),
            grants: req.grants.clone().filter(|g| !g.is_empty()),
            ..TaskRow::new(
                task_id.clone(),
                &req.session,
                req.tool.clone(),
                TaskKind::Call,
                summary,
                req.args.to_string(),
            )
        };
        self.registry.insert_task(&row)?;
        let live = Live::new(&row, private, Some(public), netns_key);
        let rx = foreground.then(|| {
            let (tx, rx) = oneshot::channel();
            live.lock().fg = Some(tx);
            rx
        });
        self.live_map().insert(task_id, live.clone());
        if let Some(on_live) = extras.on_live {
            on_live(self);
        }
        if let Some(e) = egress {
            self.serve_egress(e);
        }
        // A piped stdin exists from submission on, so messages to a queued task wait in the
        // pipe for the command to start.
        let stdin_pipe = match req.stdin {
            StdinMode::Pipe => {
                let io = |source| ExecError::Io {
                    step: "create stdin pipe for",
                    path: public_path.clone(),
                    source,
                };
                let (r, w) = sys::pipe().map_err(io)?;
                live.lock().stdin = Some(stdin_writer(w, live.stdin_queued.clone()).map_err(io)?);
                Some(r)
            }
            StdinMode::Null => None,
        };
        self.start_or_queue(live, stdin_pipe);
        Ok((row, rx))
    }
}
