//! SGD with momentum (and optional decoupled weight decay).

use super::{grad_of, local_view};
use crate::nn::Module;
use crate::{Backend, GradStore, Result, Tensor};
use std::collections::BTreeMap;

/// Stochastic gradient descent with momentum.
pub struct Sgd<B: Backend> {
    /// Learning rate.
    pub lr: f64,
    /// Momentum (0 for plain SGD).
    pub momentum: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    velocity: BTreeMap<String, Tensor<B>>,
    steps: u64,
}

impl<B: Backend> Sgd<B> {
    /// A fresh optimizer.
    pub fn new(lr: f64, momentum: f64, weight_decay: f64) -> Self {
        Sgd { lr, momentum, weight_decay, velocity: BTreeMap::new(), steps: 0 }
    }

    /// One update of every parameter of `model` that has a gradient in `grads`.
    pub fn step<M: Module<B> + ?Sized>(&mut self, model: &mut M, grads: &GradStore<B>) -> Result<()> {
        self.steps += 1;
        let (lr, mu, wd) = (self.lr, self.momentum, self.weight_decay);
        let vel = &mut self.velocity;
        super::update_each(model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else { return Ok(None) };
            let (x, g) = (local_view(p), local_view(g));
            let v = match vel.get(name) {
                Some(v) if mu > 0.0 => v.scale(mu)?.add(&g)?,
                _ => g,
            };
            if mu > 0.0 {
                vel.insert(name.to_string(), v.clone());
            }
            Ok(Some(x.scale(1.0 - lr * wd)?.sub(&v.scale(lr)?)?.storage().clone()))
        })
    }
}

impl<B: Backend> super::Optimizer<B> for Sgd<B> {
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()> {
        self.step(model, grads)
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn state_tensors(&self) -> Result<Vec<(String, Tensor<B>)>> {
        Ok(self.velocity.iter().map(|(n, v)| (format!("velocity/{n}"), v.clone())).collect())
    }
    fn load_state(&mut self, steps: u64, state: BTreeMap<String, Tensor<B>>) -> Result<()> {
        let mut velocity = BTreeMap::new();
        for (k, v) in state {
            if let Some(n) = k.strip_prefix("velocity/") {
                velocity.insert(n.to_string(), v);
            }
        }
        self.steps = steps;
        self.velocity = velocity;
        Ok(())
    }
}
