//! Keys, k9s and bottom style: what each does to the [`App`] and which ask the source
//! for something ([`Control`]).
//!
//! Owns: [`App::on_key`] and the prompt editing (`/` filter, `:` command).
//! Never: draw, or act on the source itself: pause, step, speed and seek come back as a
//! [`Control`] for the terminal loop to pass on.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::app::{App, Prompt, View};
use super::model::Control;

/// Rows PgUp and PgDn move (the app does not know the screen's height).
const PAGE_ROWS: usize = 20;

/// Every key, for the help overlay: (keys, what they do).
pub(crate) const KEY_HELP: [(&str, &str); 17] = [
    ("q  Ctrl-C", "quit"),
    (
        "space  f",
        "freeze / unfreeze the screen (updates keep coming)",
    ),
    ("/", "filter workers: tier=host blocks>1000 gaps>0"),
    ("s  S", "next sort column / reverse the sort"),
    ("Tab  Shift-Tab", "next / previous view"),
    (
        ":",
        ":workers :charts :routes :integrity :transfers :help :q",
    ),
    ("Enter  Esc", "drill into the selected worker / back"),
    ("Up Down j k", "move the selection"),
    ("PgUp PgDn g G", "page / top / bottom"),
    ("+  -", "play twice / half as fast (sim, replay)"),
    ("p", "pause / play (sim, replay)"),
    ("n  .", "one step while paused (sim, replay)"),
    ("[  ]", "seek 10 s back / forward (replay)"),
    ("?", "this help"),
    (
        "filter fields",
        "worker rank tier blocks device host disk remote",
    ),
    ("", "events age gaps ooo reconnects mismatches lost"),
    ("", "restarts queued running status"),
];

impl App {
    /// Handles one key; returns what it asks of the source, if anything.
    pub(crate) fn on_key(&mut self, key: KeyEvent) -> Option<Control> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c')) {
            self.quit = true;
            return None;
        }
        if self.prompt.is_some() {
            self.prompt_key(key.code);
            return None;
        }
        self.message = None;
        if self.help {
            // The overlay takes every key but quit and its own close.
            match key.code {
                KeyCode::Char('q') => self.quit = true,
                KeyCode::Char('?') | KeyCode::Esc => self.help = false,
                _ => {}
            }
            return None;
        }
        let played = self.config.kind.is_played();
        let control = match key.code {
            KeyCode::Char('q') => {
                self.quit = true;
                None
            }
            KeyCode::Char(' ' | 'f') => {
                self.toggle_freeze();
                None
            }
            KeyCode::Char('/') => {
                self.prompt = Some(Prompt::Filter(self.filter.text().to_owned()));
                None
            }
            KeyCode::Char(':') => {
                self.prompt = Some(Prompt::Command(String::new()));
                None
            }
            KeyCode::Char('s') => {
                self.cycle_sort();
                None
            }
            KeyCode::Char('S') => {
                self.descending = !self.descending;
                None
            }
            KeyCode::Tab => {
                self.show(self.view.cycle(1));
                None
            }
            KeyCode::BackTab => {
                self.show(self.view.cycle(-1));
                None
            }
            KeyCode::Char('?') => {
                self.help = true;
                None
            }
            KeyCode::Enter => {
                self.drill_in();
                None
            }
            KeyCode::Esc => {
                if self.detail.take().is_none() && !self.filter.is_empty() {
                    self.apply_filter("");
                }
                None
            }
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-(PAGE_ROWS as isize)),
            KeyCode::PageDown => self.move_selection(PAGE_ROWS as isize),
            KeyCode::Char('g') | KeyCode::Home => {
                self.selected = 0;
                None
            }
            KeyCode::Char('G') | KeyCode::End => {
                self.selected = self.list_len().saturating_sub(1);
                None
            }
            KeyCode::Char('+') => {
                self.speed *= 2.0;
                Some(Control::Speed(2.0))
            }
            KeyCode::Char('-') => {
                self.speed *= 0.5;
                Some(Control::Speed(0.5))
            }
            KeyCode::Char('p') => {
                self.paused = !self.paused;
                Some(Control::Pause(self.paused))
            }
            KeyCode::Char('n' | '.') => Some(Control::Step),
            KeyCode::Char('[') => Some(Control::Seek(-10_000)),
            KeyCode::Char(']') => Some(Control::Seek(10_000)),
            _ => None,
        };
        if control.is_some() && !played {
            self.message = Some(format!(
                "a {} source plays live: pause, step, speed and seek do nothing",
                self.config.kind.name()
            ));
        }
        control
    }

    /// A key while a prompt is open: edit, apply (Enter) or cancel (Esc).
    fn prompt_key(&mut self, code: KeyCode) {
        let Some(prompt) = self.prompt.as_mut() else {
            return;
        };
        let text = match prompt {
            Prompt::Filter(text) | Prompt::Command(text) => text,
        };
        match code {
            KeyCode::Char(c) => text.push(c),
            KeyCode::Backspace => {
                text.pop();
            }
            KeyCode::Esc => self.prompt = None,
            KeyCode::Enter => match self.prompt.take() {
                Some(Prompt::Filter(text)) => self.apply_filter(&text),
                Some(Prompt::Command(text)) => self.command(&text),
                None => {}
            },
            _ => {}
        }
    }

    /// Runs a `:` command.
    fn command(&mut self, text: &str) {
        let name = text.trim().trim_start_matches(':');
        if let Some(view) = View::ALL.iter().find(|v| v.name() == name) {
            self.show(*view);
            return;
        }
        match name {
            "help" | "h" => self.help = true,
            "q" | "quit" => self.quit = true,
            "" => {}
            other => {
                self.message = Some(format!(
                    "unknown command `:{other}`; expected :workers :charts :routes :integrity :transfers :help :q"
                ));
            }
        }
    }

    /// Switches to `view`, leaving any drill-in.
    fn show(&mut self, view: View) {
        if view != self.view {
            self.selected = 0;
        }
        self.view = view;
        self.detail = None;
    }

    /// Enter: drills into the selected worker where the view lists workers.
    fn drill_in(&mut self) {
        if self.detail.is_some() || !self.view.lists_workers() {
            return;
        }
        let rows = self.rows();
        if let Some(row) = rows.get(self.selected(rows.len())) {
            self.detail = Some(row.key);
        }
    }

    fn move_selection(&mut self, by: isize) -> Option<Control> {
        let len = self.list_len();
        let at = self.selected(len) as isize + by;
        self.selected = at.clamp(0, len.saturating_sub(1) as isize) as usize;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::dash::app::{AppConfig, SortColumn, SourceKind};
    use crate::cmd::dash::model::{Delta, TimedUpdate, Update, WorkerKey, WorkerRow};

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn chars(app: &mut App, text: &str) {
        for c in text.chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
    }

    fn app_with(workers: u64, kind: SourceKind) -> App {
        let mut app = App::new(AppConfig::new("test", kind));
        let rows = (0..workers)
            .map(|w| WorkerRow {
                key: WorkerKey {
                    worker: w,
                    dp_rank: 0,
                },
                blocks: [w * 10, 0, 0, 0],
                gaps: w % 3,
                ..WorkerRow::default()
            })
            .collect();
        app.on_update(TimedUpdate {
            at_ms: 0,
            update: Update::Delta(Delta {
                workers: rows,
                ..Delta::default()
            }),
        });
        app.on_tick(0);
        app
    }

    #[test]
    fn quit_on_q_and_ctrl_c() {
        let mut app = app_with(1, SourceKind::Router);
        app.on_key(key(KeyCode::Char('q')));
        assert!(app.should_quit());
        let mut app = app_with(1, SourceKind::Router);
        app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(app.should_quit());
    }

    #[test]
    fn controls_come_back_for_the_source() {
        let mut app = app_with(1, SourceKind::Sim);
        assert_eq!(
            app.on_key(key(KeyCode::Char('+'))),
            Some(Control::Speed(2.0))
        );
        assert_eq!(
            app.on_key(key(KeyCode::Char('-'))),
            Some(Control::Speed(0.5))
        );
        assert_eq!(
            app.on_key(key(KeyCode::Char('p'))),
            Some(Control::Pause(true))
        );
        assert_eq!(
            app.on_key(key(KeyCode::Char('p'))),
            Some(Control::Pause(false))
        );
        assert_eq!(app.on_key(key(KeyCode::Char('n'))), Some(Control::Step));
        assert_eq!(app.on_key(key(KeyCode::Char('.'))), Some(Control::Step));
        assert_eq!(
            app.on_key(key(KeyCode::Char('['))),
            Some(Control::Seek(-10_000))
        );
        assert_eq!(
            app.on_key(key(KeyCode::Char(']'))),
            Some(Control::Seek(10_000))
        );
        assert_eq!(app.message, None);
        let mut live = app_with(1, SourceKind::Router);
        assert_eq!(
            live.on_key(key(KeyCode::Char('p'))),
            Some(Control::Pause(true))
        );
        assert!(live.message.as_deref().unwrap().contains("plays live"));
    }

    #[test]
    fn filter_prompt_applies_on_enter_and_keeps_the_old_one_on_error() {
        let mut app = app_with(10, SourceKind::Router);
        app.on_key(key(KeyCode::Char('/')));
        chars(&mut app, "gaps>0x");
        app.on_key(key(KeyCode::Backspace));
        app.on_key(key(KeyCode::Enter));
        assert_eq!(app.filter.text(), "gaps>0");
        assert_eq!(app.rows().len(), 6);
        app.on_key(key(KeyCode::Char('/')));
        assert_eq!(
            app.prompt,
            Some(Prompt::Filter("gaps>0".into())),
            "the prompt starts from the filter"
        );
        chars(&mut app, " bogus");
        app.on_key(key(KeyCode::Enter));
        assert_eq!(app.filter.text(), "gaps>0", "old filter kept");
        assert!(app.message.as_deref().unwrap().contains("`bogus`"));
        app.on_key(key(KeyCode::Char('/')));
        chars(&mut app, " gaps<2");
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.filter.text(), "gaps>0", "Esc cancels");
        assert_eq!(app.prompt, None);
    }

    #[test]
    fn sort_cycles_and_reverses() {
        let mut app = app_with(5, SourceKind::Router);
        assert_eq!(app.rows()[0].key.worker, 0);
        chars(&mut app, "ss");
        assert_eq!(app.sort, SortColumn::Blocks);
        assert_eq!(app.rows()[0].key.worker, 4, "biggest first");
        chars(&mut app, "S");
        assert_eq!(app.rows()[0].key.worker, 0);
    }

    #[test]
    fn views_cycle_and_commands_switch() {
        let mut app = app_with(1, SourceKind::Router);
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.view, View::Charts);
        app.on_key(key(KeyCode::BackTab));
        app.on_key(key(KeyCode::BackTab));
        assert_eq!(app.view, View::Transfers);
        app.on_key(key(KeyCode::Char(':')));
        chars(&mut app, "routes");
        app.on_key(key(KeyCode::Enter));
        assert_eq!(app.view, View::Routes);
        app.on_key(key(KeyCode::Char(':')));
        chars(&mut app, "nope");
        app.on_key(key(KeyCode::Enter));
        assert!(app.message.as_deref().unwrap().contains(":nope"));
        app.on_key(key(KeyCode::Char(':')));
        chars(&mut app, "q");
        app.on_key(key(KeyCode::Enter));
        assert!(app.should_quit());
    }

    #[test]
    fn selection_moves_clamped_and_enter_drills_in() {
        let mut app = app_with(30, SourceKind::Router);
        app.on_key(key(KeyCode::Up));
        assert_eq!(app.selected, 0);
        chars(&mut app, "jjk");
        assert_eq!(app.selected, 1);
        app.on_key(key(KeyCode::PageDown));
        assert_eq!(app.selected, 21);
        app.on_key(key(KeyCode::PageDown));
        assert_eq!(app.selected, 29);
        chars(&mut app, "g");
        assert_eq!(app.selected, 0);
        chars(&mut app, "G");
        app.on_key(key(KeyCode::Enter));
        assert_eq!(
            app.detail,
            Some(WorkerKey {
                worker: 29,
                dp_rank: 0
            })
        );
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.detail, None);
    }

    #[test]
    fn freeze_shows_a_snapshot_while_updates_fold_underneath() {
        let mut app = app_with(2, SourceKind::Router);
        app.on_key(key(KeyCode::Char(' ')));
        assert!(app.is_frozen());
        app.on_update(TimedUpdate {
            at_ms: 1_000,
            update: Update::Delta(Delta {
                workers: vec![WorkerRow {
                    key: WorkerKey {
                        worker: 9,
                        dp_rank: 0,
                    },
                    ..WorkerRow::default()
                }],
                ..Delta::default()
            }),
        });
        app.on_tick(1_000);
        assert_eq!(app.world().workers.len(), 2);
        assert_eq!(app.world().now_ms, 0);
        app.on_key(key(KeyCode::Char('f')));
        assert_eq!(app.world().workers.len(), 3);
        assert_eq!(app.world().now_ms, 1_000);
    }

    #[test]
    fn help_toggles_and_swallows_other_keys() {
        let mut app = app_with(1, SourceKind::Sim);
        app.on_key(key(KeyCode::Char('?')));
        assert!(app.help);
        assert_eq!(app.on_key(key(KeyCode::Char('p'))), None);
        app.on_key(key(KeyCode::Char('?')));
        assert!(!app.help);
    }
}
