"""Example for `diffill complete` (README): line 15 is where `variance` needs its body."""


def mean(values):
    """Arithmetic mean of a non-empty list of numbers."""
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    """Population variance."""
    m = mean(values)



def main():
    data = [1, 2, 3, 4, 5]
    print("mean", mean(data))
    print("variance", variance(data))


if __name__ == "__main__":
    main()
