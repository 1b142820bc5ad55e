//! Dead letters in flight: sent through the producer without blocking the engine, retried with
//! the backoff while the producer refuses them, and a record final only once its letter is
//! delivered (SPEC 7, dead letters).

use super::*;

/// A dead letter in flight.
pub(super) struct LetterDone {
    pub(super) partition: i32,
    pub(super) generation: u64,
    pub(super) offset: i64,
    pub(super) attempt: u32,
    pub(super) reason: &'static str,
    pub(super) letter: Arc<Letter>,
    pub(super) result: Result<(), KafkaError>,
}

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_letter(
        &mut self,
        partition: i32,
        generation: u64,
        offset: i64,
        reason: &'static str,
        letter: Arc<Letter>,
        attempt: u32,
        delay: Duration,
    ) {
        if let Some(window) = self.driver.window_mut(&partition) {
            window.state.letters += 1;
        }
        let producer = self.producer.clone();
        let topic = self.settings.dlq_topic.clone();
        self.letters.push(Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let result = dead_letter::send(&producer, &topic, &letter).await;
            LetterDone {
                partition,
                generation,
                offset,
                attempt,
                reason,
                letter,
                result,
            }
        }));
    }

    pub(super) fn on_letter(&mut self, done: LetterDone) {
        let Some(window) = self
            .driver
            .window_mut(&done.partition)
            .filter(|w| w.generation() == done.generation)
        else {
            return;
        };
        window.state.letters = window.state.letters.saturating_sub(1);
        match done.result {
            Ok(()) => {
                self.telemetry.health().set_dead_letters(true);
                window.pipeline.dead_lettered(done.offset);
                self.telemetry.dead_lettered(
                    done.partition,
                    done.offset,
                    done.reason,
                    done.letter.truncated,
                );
            }
            Err(error) => {
                self.telemetry.health().set_dead_letters(false);
                self.telemetry.dead_letter_failed(
                    done.partition,
                    done.offset,
                    &error,
                    done.attempt,
                );
                // A fatal producer error (librdkafka's idempotence guarantee broken, a fenced
                // producer) fails every later send too: resending forever would pin the
                // partition with readiness still true. Drain and exit non-zero instead, so the
                // orchestrator restarts the replica with a new producer (SPEC 7.2).
                if let Some(reason) = dead_letter::fatal(&self.producer, &error) {
                    tracing::error!(error = %error, reason = %reason, "the dead-letter producer failed fatally");
                    self.fatal = Some(format!("the dead-letter producer failed fatally: {reason}"));
                    return;
                }
                let mut letter = done.letter;
                if dead_letter::is_too_large(&error) && !letter.truncated {
                    // The producer's real limit is below the configured one: send the excerpt.
                    letter = Arc::new(dead_letter::truncate(
                        (*letter).clone(),
                        self.settings.dlq_max_message_bytes,
                    ));
                }
                let delay = self.settings.backoff.delay(done.attempt);
                let generation = window.generation();
                self.send_letter(
                    done.partition,
                    generation,
                    done.offset,
                    done.reason,
                    letter,
                    done.attempt + 1,
                    delay,
                );
            }
        }
    }
}
