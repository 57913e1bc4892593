-- The last instant at which the checkout's charge may start: the deadline of the request that asked
-- for the payment (PayCheckout, or a one-call CreateCheckout), less the margin its answer needs.
-- A worker carrying the saga on after that request is gone (its deadline passed, it was cancelled,
-- its process died) does not start the charge past this instant: the holds go back, the checkout
-- ends FAILED with failure_reason 'pay-deadline-passed', and nobody is charged for a purchase they
-- stopped waiting for. Once the charge has started the saga finishes it whatever the time.
-- NULL: no deadline (a caller without one, or a checkout paid before this column existed).
ALTER TABLE checkouts ADD COLUMN pay_deadline timestamptz;
