/* A library function that an interposer wraps (see test_interpose.py). */
int vcudatest_value(void);
int vcudatest_value(void) { return 42; }
