//! The terminal loop of `kvtwin dash`, and `--once`.
//!
//! Owns: the terminal's set-up and restoration (raw mode and the alternate screen,
//! restored on quit, Ctrl-C, SIGTERM and panic), the `select!` over a render tick, the
//! keyboard and the source, recording what the source says, and `--once` (fold until
//! the source has said enough, print one plain-text frame).
//! Never: hold state of its own beyond the loop's (the app does), or draw anything but
//! `ui::render`.

use super::app::{App, AppConfig};
use super::model::TimedUpdate;
use super::record::Recorder;
use super::source::{Source, SourceEvent};
use super::ui;
use anyhow::{Context, Result};
use crossterm::event::{Event, EventStream, KeyEventKind};
use futures::StreamExt;
use std::time::Duration;

/// How often the screen is drawn (and the app's clock moves) without a key or an update.
const RENDER_TICK: Duration = Duration::from_millis(100);

/// What a loop needs besides its source.
pub(crate) struct LoopConfig {
    /// The app's configuration.
    pub(crate) app: AppConfig,
    /// Where to record what the source says.
    pub(crate) recorder: Option<Recorder>,
}

/// Folds an update into the app, recording it first.
fn take(app: &mut App, recorder: &mut Option<Recorder>, update: TimedUpdate) -> Result<()> {
    if let Some(recorder) = recorder {
        recorder.append(&update)?;
    }
    app.on_update(update);
    Ok(())
}

/// Runs the dashboard in this terminal until `q`, Ctrl-C or SIGTERM.
pub(crate) async fn interactive(mut source: Box<dyn Source>, config: LoopConfig) -> Result<()> {
    let LoopConfig {
        app: app_config,
        mut recorder,
    } = config;
    let mut app = App::new(app_config.clone());
    // ratatui::init enters raw mode and the alternate screen and installs a panic hook
    // that restores the terminal before the panic message prints.
    let mut terminal = ratatui::init();
    let result = async {
        let mut keys = EventStream::new();
        let mut tick = tokio::time::interval(RENDER_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut terminate = terminate_signal()?;
        let mut source_open = true;
        loop {
            let mut redraw = false;
            tokio::select! {
                _ = tick.tick() => {
                    // A played source's clock moves with its updates alone (see
                    // `App::on_update`); a live one's moves with the wall clock, so ages
                    // grow while nothing comes.
                    if !app_config.kind.is_played() {
                        app.on_tick(source.now_ms());
                    }
                    if let Some(recorder) = &mut recorder {
                        recorder.flush()?;
                    }
                    redraw = true;
                }
                event = source.next(), if source_open => match event {
                    SourceEvent::Update(update) => take(&mut app, &mut recorder, update)?,
                    SourceEvent::Rewind => app = app.rewound(),
                    SourceEvent::End => source_open = false,
                },
                key = keys.next() => match key {
                    Some(Ok(Event::Key(key))) if key.kind != KeyEventKind::Release => {
                        if let Some(control) = app.on_key(key) {
                            source.control(control);
                        }
                        // A key is answered at once, not at the next tick.
                        redraw = true;
                    }
                    Some(Ok(Event::Resize(..))) => redraw = true,
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(error).context("reading the terminal"),
                    None => break,
                },
                _ = terminate.recv() => break,
            }
            if app.should_quit() {
                break;
            }
            if redraw {
                terminal
                    .draw(|frame| ui::render(&app, frame))
                    .context("drawing the dashboard")?;
            }
        }
        Ok(())
    }
    .await;
    ratatui::restore();
    if let Some(recorder) = &mut recorder {
        recorder.flush()?;
        eprintln!("kvtwin dash: recorded {} updates", recorder.written());
    }
    result
}

/// SIGTERM as a stream (a never-firing one where there is no such signal).
fn terminate_signal() -> Result<Terminate> {
    #[cfg(unix)]
    {
        let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        Ok(Terminate(signal))
    }
    #[cfg(not(unix))]
    Ok(Terminate(()))
}

#[cfg(unix)]
struct Terminate(tokio::signal::unix::Signal);
#[cfg(not(unix))]
struct Terminate(());

impl Terminate {
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.0.recv().await;
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    }
}

/// When `--once` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnceUntil {
    /// The source's end (a simulation's last snapshot, a recording's last update).
    End,
    /// The first full picture of the workers (a router's first delta).
    FirstFull,
    /// The timeout: a replica listens that long, for the engines' replay to catch it up.
    Deadline,
}

/// Folds what the source says until `until` (or, for a live source, `timeout`), then
/// returns one frame as plain text of `width` × `height`.
pub(crate) async fn once(
    mut source: Box<dyn Source>,
    config: LoopConfig,
    until: OnceUntil,
    timeout: Duration,
    (width, height): (u16, u16),
) -> Result<String> {
    let LoopConfig {
        app: app_config,
        mut recorder,
    } = config;
    let mut app = App::new(app_config.clone());
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            event = source.next() => match event {
                SourceEvent::Update(update) => {
                    let full = matches!(&update.update, super::model::Update::Delta(d) if d.full);
                    take(&mut app, &mut recorder, update)?;
                    if full && until == OnceUntil::FirstFull {
                        break;
                    }
                }
                SourceEvent::Rewind => app = app.rewound(),
                SourceEvent::End => break,
            },
            // A simulation or a recording plays to its end however long that takes (a
            // busy machine once cut a simulation short at the live sources' 10 s).
            _ = &mut deadline, if until != OnceUntil::End => break,
        }
    }
    if !app_config.kind.is_played() {
        app.on_tick(source.now_ms());
    }
    if let Some(recorder) = &mut recorder {
        recorder.flush()?;
    }
    Ok(ui::render_text(&app, width, height))
}
