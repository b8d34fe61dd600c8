//! The drain loop every driver of a [`Manager`] runs, written once.
//!
//! Owns: [`Driver`] (what a driver does with each output and each event) and [`settle`]
//! (the drain order of [`Manager`]'s docs: completions, outputs until none is left and
//! no handled output produced more, then the events in order, then the next deadline).
//! The simulator's cluster and the validation driver both settle their managers through
//! it, so they cannot drift apart in the order they drain.
//! Never: read a clock or publish anything itself: the driver says what `now` is and
//! where outputs and events go.

use super::{Manager, ManagerOutput};
use crate::events::KvCacheEvent;
use crate::hardware::Hardware;
use crate::ids::Timestamp;

/// A driver of one manager: where its outputs and events go.
///
/// The driver owns the manager (or reaches it through what it owns) and lends it to
/// [`settle`] between the calls: handling an output may use the manager again (an
/// onboarding that finished lets its request allocate blocks to prefill).
pub trait Driver {
    /// The manager's hardware.
    type Hardware: Hardware;

    /// The manager being settled.
    fn manager(&mut self) -> &mut Manager<Self::Hardware>;

    /// A finished piece of work, in the order the manager finished them.
    fn on_output(&mut self, output: ManagerOutput);

    /// One event of the worker's stream, in order.
    fn on_event(&mut self, event: KvCacheEvent);
}

/// Settles `driver`'s manager at `now`: hands it its finished transfers and passes every
/// output to the driver, again until a round produces none (handling an output may
/// finish more work), then every event, in order. Returns the manager's next deadline.
pub fn settle<D: Driver>(driver: &mut D, now: Timestamp) -> Option<Timestamp> {
    loop {
        driver.manager().handle_completions(now);
        let mut progressed = false;
        while let Some(output) = driver.manager().poll_output() {
            progressed = true;
            driver.on_output(output);
        }
        if !progressed {
            break;
        }
    }
    let mut events = driver.manager().take_events();
    for event in events.drain(..) {
        driver.on_event(event);
    }
    driver.manager().recycle_events(events);
    driver.manager().poll_timeout()
}
