//! The built-in task: generated arithmetic questions (`17+25=`) answered by a number and an end token,
//! a character-level tokenizer, and the verifiable `score` signal (1 when the answer matches exactly).

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Character-level vocabulary: `<pad>`, `<eos>`, then one token per character of `CHARS`.
pub struct Tokenizer;

pub const PAD: u32 = 0;
pub const EOS: u32 = 1;
const CHARS: &str = "0123456789+-*= ";

impl Tokenizer {
    pub fn vocab_size(&self) -> usize {
        2 + CHARS.len()
    }

    /// Ids of `text`; an error names a character outside the vocabulary.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        text.chars()
            .map(|c| {
                CHARS
                    .find(c)
                    .map(|i| i as u32 + 2)
                    .ok_or_else(|| format!("character {c:?} is not in the tokenizer's vocabulary"))
            })
            .collect()
    }

    /// Text of `ids`, stopping at the first `<eos>`; `<pad>` is skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut out = String::new();
        for &id in ids {
            match id {
                EOS => break,
                PAD => {}
                id => out.push(CHARS.as_bytes()[(id - 2) as usize] as char),
            }
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// Operands are drawn uniformly from 0..=max_operand.
    pub max_operand: usize,
    /// Operators to draw from, any of `+`, `-`, `*`.
    pub ops: String,
    /// Held-out questions for greedy-decoding accuracy.
    pub eval_questions: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    pub prompt: String,
    pub answer: String,
}

pub struct Arithmetic {
    pub config: TaskConfig,
}

impl Arithmetic {
    pub fn new(config: TaskConfig) -> Result<Arithmetic, String> {
        if config.ops.is_empty() || config.ops.chars().any(|c| !"+-*".contains(c)) {
            return Err(format!(
                "task.ops = {:?}: use one or more of `+`, `-`, `*`",
                config.ops
            ));
        }
        Ok(Arithmetic { config })
    }

    pub fn question(&self, rng: &mut Rng) -> Question {
        let a = rng.int(0, self.config.max_operand) as i64;
        let b = rng.int(0, self.config.max_operand) as i64;
        let ops: Vec<char> = self.config.ops.chars().collect();
        let op = ops[rng.int(0, ops.len() - 1)];
        let answer = match op {
            '+' => a + b,
            '-' => a - b,
            _ => a * b,
        };
        Question {
            prompt: format!("{a}{op}{b}="),
            answer: answer.to_string(),
        }
    }

    /// The fixed held-out set (its own seed stream, so it does not depend on training).
    pub fn eval_set(&self, seed: u64) -> Vec<Question> {
        let mut rng = Rng::new(seed ^ 0xE7A1);
        (0..self.config.eval_questions)
            .map(|_| self.question(&mut rng))
            .collect()
    }

    /// 1 when the completion is exactly the answer followed by `<eos>`, else 0.
    pub fn score(&self, question: &Question, completion: &[u32]) -> f64 {
        let stopped = completion.contains(&EOS);
        if stopped && Tokenizer.decode(completion) == question.answer {
            1.0
        } else {
            0.0
        }
    }
}
