-- Issue 30: which provider's day `budget.reached` was told for. With several
-- hosts, each finds the budget reached on its own; one insert wins per
-- provider and day (`until`: 00:00 UTC of the next day), so the webhook is
-- sent once, not once per host.
CREATE TABLE budget_told (
    provider TEXT NOT NULL,
    until REAL NOT NULL,
    told_at REAL NOT NULL,
    PRIMARY KEY (provider, until)
);
