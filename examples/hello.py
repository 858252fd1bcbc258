import sys
print("hello from", sys.version.split()[0])
sum(range(10))
