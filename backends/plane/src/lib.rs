//! kvtwin-plane: the event plane.
//!
//! Owns: [`wire`] (the untrusted wire formats), [`zmq`] and [`nats`] (the transports),
//! [`service`] (the router service and the relay).
//! Never: depend on the simulator or on real hardware.

pub mod bench;
pub mod nats;
pub mod service;
pub mod wire;
pub mod zmq;
