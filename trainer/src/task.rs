//! What the training loop needs from a task ([`Task`]: prompts for a step, recipe inputs filled from
//! completions by name, held-out prompts and correctness for evaluation, optional supervised examples),
//! and the built-in task: generated arithmetic questions (`17+25=`) answered by a number and an end
//! token, a character-level tokenizer, and the verifiable `score` signal (1 when the answer matches
//! exactly).

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

/// One prompt: its token ids, its text, and the reference answer when the task has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub text: String,
    pub answer: Option<String>,
    /// The task's own index of this prompt (its data row), for tasks that keep per-prompt data.
    pub key: usize,
}

/// The models a task may use to fill its inputs: the policy being trained (e.g. as a self-rewarding
/// judge) and the frozen reference, when the recipe has one.
#[derive(Clone, Copy)]
pub struct TaskModels<'a> {
    pub policy: &'a crate::model::Model,
    pub reference: Option<&'a crate::model::Model>,
}

/// The recipe inputs a task filled for one batch, each flat in the runtime's element order
/// (docs/formats.md, packed layout), with the layout facts they imply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SignalBatch {
    /// (input name, values), in the order of [`Task::signals`].
    pub values: Vec<(String, Vec<f64>)>,
    /// Criteria per group when some input has a `crit` axis (the batch's `crit_offsets` are their
    /// prefix sums).
    pub crit_counts: Option<Vec<usize>>,
    /// The `dim` axis length when some input has one.
    pub dim: Option<usize>,
}

/// Supervised examples: (prompt ids, target ids ending with the stop token).
pub type Examples = Vec<(Vec<u32>, Vec<u32>)>;

/// A source of prompts and signals for the training loop. Completions are prompt-major: completion `r`
/// answers `prompts[r / n]`.
pub trait Task {
    /// A short name for messages and metrics.
    fn name(&self) -> String;

    /// The tokens that end a completion (the sampler stops a row at the first of them); empty = none.
    fn stop_tokens(&self) -> Vec<u32>;

    /// The names of the recipe inputs this task fills (response-level `f32[resp]` ones unless
    /// [`Task::fills_any_shape`]).
    fn signals(&self) -> Vec<String>;

    /// Whether the task checked the types of the inputs it fills against the recipe itself, so they may
    /// have any level and feature axis (the text tasks' signals registry); otherwise each is `f32[resp]`.
    fn fills_any_shape(&self) -> bool {
        false
    }

    /// Every input of [`Task::signals`] for a batch (completion `r` answers `prompts[r / n]`). The default
    /// calls [`Task::signal`] for each, one value per response.
    fn fill(
        &self,
        prompts: &[Prompt],
        completions: &[Vec<u32>],
        n: usize,
        models: &TaskModels,
    ) -> Result<SignalBatch, String> {
        let _ = models;
        let mut values = Vec::new();
        for name in self.signals() {
            let v = self.signal(&name, prompts, completions, n)?;
            values.push((name, v));
        }
        Ok(SignalBatch {
            values,
            crit_counts: None,
            dim: None,
        })
    }

    /// `count` prompts for one step, drawn from `rng` (the only randomness a task may use).
    fn prompts(&self, rng: &mut Rng, count: usize) -> Result<Vec<Prompt>, String>;

    /// The values of the signal `name` (one of [`Task::signals`]) for each completion.
    fn signal(
        &self,
        name: &str,
        prompts: &[Prompt],
        completions: &[Vec<u32>],
        n: usize,
    ) -> Result<Vec<f64>, String>;

    /// 1 when `completion` is a correct answer to `prompt`, else 0; `None` when the task is not
    /// verifiable (then no accuracy is reported).
    fn correct(&self, prompt: &Prompt, completion: &[u32]) -> Option<f64>;

    /// The partition class of `completion` when the task has an exact one (two completions with the
    /// same class are the same answer), for the evaluation's diversity metrics; `None` = no partition.
    fn answer_class(&self, prompt: &Prompt, completion: &[u32]) -> Option<Vec<u32>> {
        let _ = (prompt, completion);
        None
    }

    /// Whether the signal `name` holds partition class ids rather than scores (its mean or best over
    /// samples means nothing, so the evaluation leaves it out of its per-signal metrics).
    fn is_class(&self, name: &str) -> bool {
        let _ = name;
        false
    }

    /// The fixed held-out prompts for greedy evaluation (they must not depend on training).
    fn eval_prompts(&self, seed: u64) -> Result<Vec<Prompt>, String>;

    /// `count` supervised examples (prompt ids, target ids ending with the stop token) for the warm
    /// start, or `None` when the task has none.
    fn supervised(&self, rng: &mut Rng, count: usize) -> Result<Option<Examples>, String>;

    /// The longest prompt, in tokens, this task can produce (checked against the model's positions).
    fn max_prompt_tokens(&self) -> usize;

    /// Text of generated ids (for messages).
    fn decode(&self, ids: &[u32]) -> String;
}

/// An error unless there are `n` completions per prompt.
pub fn check_counts(prompts: &[Prompt], completions: &[Vec<u32>], n: usize) -> Result<(), String> {
    if completions.len() == prompts.len() * n {
        Ok(())
    } else {
        Err(format!(
            "{} completions for {} prompts × {n} samples",
            completions.len(),
            prompts.len()
        ))
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
        if config.max_operand > 1_000_000 {
            return Err(format!(
                "task.max_operand = {} is too large (at most 1000000)",
                config.max_operand
            ));
        }
        Ok(Arithmetic { config })
    }

    fn prompt(question: &Question) -> Result<Prompt, String> {
        Ok(Prompt {
            ids: Tokenizer.encode(&question.prompt)?,
            text: question.prompt.clone(),
            answer: Some(question.answer.clone()),
            key: 0,
        })
    }

    fn question_of(prompt: &Prompt) -> Question {
        Question {
            prompt: prompt.text.clone(),
            answer: prompt.answer.clone().unwrap_or_default(),
        }
    }

    /// The longest answer, in characters.
    pub fn max_answer_chars(&self) -> usize {
        let m = self.config.max_operand as i64;
        let mut longest = 0;
        for op in self.config.ops.chars() {
            let extremes: [i64; 2] = match op {
                '+' => [m + m, 0],
                '-' => [-m, m],
                _ => [m * m, 0],
            };
            for e in extremes {
                longest = longest.max(e.to_string().len());
            }
        }
        longest
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

impl Task for Arithmetic {
    fn name(&self) -> String {
        format!(
            "arithmetic (0..={} with {})",
            self.config.max_operand, self.config.ops
        )
    }

    fn stop_tokens(&self) -> Vec<u32> {
        vec![EOS]
    }

    fn signals(&self) -> Vec<String> {
        vec!["score".into()]
    }

    fn prompts(&self, rng: &mut Rng, count: usize) -> Result<Vec<Prompt>, String> {
        (0..count)
            .map(|_| Arithmetic::prompt(&self.question(rng)))
            .collect()
    }

    fn signal(
        &self,
        name: &str,
        prompts: &[Prompt],
        completions: &[Vec<u32>],
        n: usize,
    ) -> Result<Vec<f64>, String> {
        if name != "score" {
            return Err(format!(
                "the arithmetic task has no signal `{name}` (it fills `score`)"
            ));
        }
        check_counts(prompts, completions, n)?;
        Ok(completions
            .iter()
            .enumerate()
            .map(|(r, c)| self.score(&Arithmetic::question_of(&prompts[r / n]), c))
            .collect())
    }

    fn correct(&self, prompt: &Prompt, completion: &[u32]) -> Option<f64> {
        Some(self.score(&Arithmetic::question_of(prompt), completion))
    }

    fn eval_prompts(&self, seed: u64) -> Result<Vec<Prompt>, String> {
        self.eval_set(seed).iter().map(Arithmetic::prompt).collect()
    }

    fn supervised(&self, rng: &mut Rng, count: usize) -> Result<Option<Examples>, String> {
        let mut examples = Vec::with_capacity(count);
        for _ in 0..count {
            let question = self.question(rng);
            let mut target = Tokenizer.encode(&question.answer)?;
            target.push(EOS);
            examples.push((Tokenizer.encode(&question.prompt)?, target));
        }
        Ok(Some(examples))
    }

    fn max_prompt_tokens(&self) -> usize {
        // Two operands, the operator and `=`.
        2 * self.config.max_operand.to_string().len() + 2
    }

    fn decode(&self, ids: &[u32]) -> String {
        Tokenizer.decode(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arithmetic_task_fills_score_and_knows_its_lengths() {
        let task = Arithmetic::new(TaskConfig {
            max_operand: 99,
            ops: "+-*".into(),
            eval_questions: 3,
        })
        .unwrap();
        assert_eq!(task.max_prompt_tokens(), 6);
        assert_eq!(task.max_answer_chars(), 4); // 99*99 = 9801, -99
        let mut rng = Rng::new(5);
        let prompts = task.prompts(&mut rng, 2).unwrap();
        let right = |p: &Prompt| {
            let mut ids = Tokenizer.encode(p.answer.as_deref().unwrap()).unwrap();
            ids.push(EOS);
            ids
        };
        let completions = vec![right(&prompts[0]), vec![EOS], right(&prompts[1]), vec![2]];
        assert_eq!(
            task.signal("score", &prompts, &completions, 2).unwrap(),
            vec![1.0, 0.0, 1.0, 0.0]
        );
        assert_eq!(
            task.signal("judge", &prompts, &completions, 2).unwrap_err(),
            "the arithmetic task has no signal `judge` (it fills `score`)"
        );
        assert_eq!(
            task.signal("score", &prompts, &completions, 3).unwrap_err(),
            "4 completions for 2 prompts × 3 samples"
        );
        assert_eq!(task.eval_prompts(0).unwrap().len(), 3);
        assert_eq!(task.eval_prompts(0).unwrap(), task.eval_prompts(0).unwrap());
    }
}
