//! `tool.call`: submit, then answer inline or `running` at the yield (docs/protocol.md).

use super::*;

impl Executor {
    /// Runs a `tool.call` to its answer: inline if the run settles before `yield_after_ms`,
    /// else `running`. `closed` resolves if the caller's connection goes away, in which case
    /// the task moves to the background so its result is not lost, or, when the call asked
    /// for it (`on_disconnect: cancel`), is stopped.
    pub(crate) async fn call(
        self: &Arc<Self>,
        req: CallRequest,
        closed: impl std::future::Future<Output = ()>,
    ) -> Result<ToolCallResult, ExecError> {
        let yield_after = req
            .yield_after_ms
            .or(self.cfg.default_yield_after_ms)
            .unwrap_or_else(|| {
                self.tools
                    .get(&req.tool)
                    .map(|t| t.describe().default_yield_after_ms)
                    .unwrap_or(30_000)
            });
        let detach = req.background || yield_after == 0;
        let on_disconnect = req.on_disconnect;
        let hint = self
            .polling
            .observe(&req.session.session_id, &req.args, detach);
        let (row, fg) = self.submit(req, !detach)?;
        let Some(mut fg) = fg else {
            return Ok(with_hint(self.running(&row.task_id, &row), hint));
        };

        let yield_at = tokio::time::sleep(Duration::from_millis(yield_after));
        let deadline_ms = self.cfg.interactive_deadline_ms;
        let deadline = tokio::time::sleep(Duration::from_millis(deadline_ms));
        tokio::pin!(yield_at, deadline, closed);
        let mut deadline_hit = false;
        let mut closed_seen = false;
        loop {
            tokio::select! {
                ev = &mut fg => {
                    return Ok(with_hint(match ev {
                        Ok(FgEvent::Settled(row)) => self.completed(&row, deadline_hit),
                        Ok(FgEvent::Backgrounded) | Err(_) => self.running(&row.task_id, &row),
                    }, hint));
                }
                _ = &mut yield_at => {
                    if self.try_yield(&row.task_id) {
                        return Ok(with_hint(self.running(&row.task_id, &row), hint));
                    }
                    // Settled in the same instant: the result is already on its way to `fg`.
                }
                _ = &mut deadline, if !deadline_hit && deadline_ms < yield_after => {
                    deadline_hit = true;
                    let message = format!(
                        "the call was still in the foreground after the interactive deadline of {} s and was stopped",
                        deadline_ms / 1000
                    );
                    self.stop(&row.task_id, StopReason::Timeout, self.cfg.cancel_grace_ms, Some(message));
                }
                _ = &mut closed, if !closed_seen => {
                    closed_seen = true;
                    match on_disconnect {
                        // Nobody is coming back for it: stop it. Its result still arrives
                        // here (and, unwritable, is handed back as `pending`: no wake).
                        OnDisconnect::Cancel => {
                            let why = "the caller went away while the call was in the foreground".to_owned();
                            self.stop(&row.task_id, StopReason::Canceled, self.cfg.cancel_grace_ms, Some(why));
                        }
                        OnDisconnect::Background => {
                            if self.try_yield(&row.task_id) {
                                return Ok(self.running(&row.task_id, &row));
                            }
                        }
                    }
                }
            }
        }
    }

    pub(super) fn running(&self, task_id: &str, row: &TaskRow) -> ToolCallResult {
        ToolCallResult::Running(RunningCall {
            task_id: task_id.to_owned(),
            output: tail(row, self.cfg.inline_output_bytes),
            output_path: row.output_path(),
            result_path: row.result_path(),
            hint: Some(format!(
                "still running in the background; its result will be delivered when it settles (task.wait {{\"task_id\": \"{task_id}\"}} to block on it)"
            )),
        })
    }

    pub(super) fn completed(&self, row: &TaskRow, deadline_hit: bool) -> ToolCallResult {
        let (output, cut) = excerpt(row, self.cfg.inline_output_bytes);
        let hint = (deadline_hit && row.reason == Some(FailReason::Timeout)).then(|| {
            "pass yield_after_ms (for example 30000) or background: true so long commands move to the background instead of being stopped; \
             a background run wakes you when it finishes".to_owned()
        });
        let rendered = self.tools.get(&row.tool).and_then(|t| {
            t.render(&sidejob_plugin_api::json::RenderInput {
                tool: row.tool.clone(),
                state: row.state.as_str().into(),
                exit_code: row.exit_code,
                output: output.clone(),
                task: serde_json::to_value(row.to_wire()).unwrap_or_default(),
            })
        });
        ToolCallResult::Completed(CompletedCall {
            rendered,
            task_id: row.task_id.clone(),
            state: row.state,
            reason: row.reason,
            exit_code: row.exit_code,
            signal: row.signal,
            output,
            output_truncated: row.output_truncated.unwrap_or(false) || cut,
            duration_ms: row.duration_ms.unwrap_or(0),
            hint,
            error: row.error.clone(),
            output_path: row.output_path(),
            result_path: row.result_path(),
        })
    }
}
